"""AttentionModel: a loaded model, the one object the service holds: our network, the checkpoint's
tokenizer and the device, and every question asked of it: `attend` (and `attend_batch`) -> AttentionResult,
`head_effects` (mha.analysis.ablation), `trace` (mha.trace), `probe_heads` (mha.model.probe), the padded
forwards a corpus job runs.

mha.model.pretrained makes one (load_pretrained, random_model); the tokenization is mha.text.tokenize's,
the attention the network's own, never transformers'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from mha._finite import refuse_non_finite, refuse_non_finite_answer
from mha._memory import held_nbytes
from mha._transfer import rows_to_host, to_device
from mha.analysis import ablation
from mha.errors import MaxTokensError, NotCausalError, TargetNotSupportedError
from mha.loading.convert.base import NetworkConfig
from mha.model import probe
from mha.networks import continuation, translate
from mha.networks.model import Transformer
from mha.networks.result import AttentionResult, ModelInfo
from mha.networks.seq2seq import EncoderDecoder
from mha.text.tokenize import Encoded, TextEncoder
from mha.trace.overview import OVERVIEW_SIZE
from mha.trace.windows import Trace

__all__ = ["AttentionModel"]


class AttentionModel:
    """A loaded model: our Transformer (or EncoderDecoder), the checkpoint's tokenizer, the device, and
    `attend`."""

    def __init__(
        self,
        network: Transformer | EncoderDecoder,
        tokenizer: Any,
        *,
        info: ModelInfo,
        pair_template: bool = True,
        lm_head: Callable[[], torch.Tensor] | None = None,
        eos_ids: Sequence[int] = (),
        logits_bias: Callable[[], torch.Tensor | None] | None = None,
    ) -> None:
        self.network: Any = network.eval()  # Any: continuation and trace take a Transformer, translate not
        self.tokenizer = tokenizer
        self.info = info
        self.pair_template = pair_template
        # The LM head's weight [V, E], read on first use (only writing text needs it); None: an encoder,
        # which cannot write. `logits_bias` [V] likewise (BART, Marian).
        self._lm_head_loader = lm_head
        self._lm_head: torch.Tensor | None = None
        self._logits_bias_loader = logits_bias
        self._logits_bias: torch.Tensor | None = None
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.device = next(network.parameters()).device
        config = network.config
        self.encoder = TextEncoder(
            tokenizer,
            vocab_size=config.vocab_size,
            type_vocab_size=config.type_vocab_size,
            pair_template=pair_template,
        )

    @property
    def config(self) -> NetworkConfig:
        config: NetworkConfig = self.network.config
        return config

    def __repr__(self) -> str:
        return f"AttentionModel({self.info})"

    @property
    def nbytes(self) -> int:
        """The bytes this model holds (mha._memory.held_nbytes): its weights, each storage once, a GGUF's
        packed blocks, the LM head and logits bias once read, and what its layers may keep dequantized."""
        return held_nbytes(self.network, (self._lm_head, self._logits_bias))

    def token_limit(self, max_tokens: int | None) -> int:
        """The longest input a call with `max_tokens` takes: the model's own when None; MaxTokensError
        when outside 1..the model's."""
        return self._max_tokens(max_tokens)

    def _max_tokens(self, max_tokens: int | None) -> int:
        limit = self.info.max_tokens
        if max_tokens is None:
            return limit
        if max_tokens < 1 or max_tokens > limit:
            raise MaxTokensError(max_tokens, limit)
        return max_tokens

    # --- attention ----------------------------------------------------------------------------------------
    def attend(
        self,
        text: str,
        text_pair: str | None = None,
        *,
        max_tokens: int | None = None,
        target: str | None = None,
        hidden_state: bool = True,
        max_new_tokens: int | None = None,
        chat: bool = False,
        cancel: Callable[[], bool] | None = None,
        norms: bool = False,
    ) -> AttentionResult:
        """Every layer's and head's attention for one text (or pair); attentions [L, H, n, n].

        An encoder-decoder (info.architecture "encoder-decoder") returns a Seq2SeqResult
        (mha.networks.translate): the decoder reads `target` (forced decoding), or with target None writes one
        greedily first, up to max_new_tokens (None: translate.DEFAULT_NEW_TOKENS); a target to any other model
        raises TargetNotSupportedError.

        hidden_state=False leaves `result.hidden_state` None and skips the work no attention depends on
        (the last layer's value path, output projection and feed-forward): what the service does.
        max_new_tokens=k (causal models) first continues the text greedily by up to k tokens, as
        transformers' generate(do_sample=False) does (stopping at an end-of-sequence token or at
        max_tokens), then returns the attention over prompt and continuation (`result.generated`).
        chat=True puts the text in the tokenizer's chat template as the user's turn, the assistant's turn
        opened (apply_chat_template(add_generation_prompt=True)); `result.texts[0]` is the rendered string.
        norms=True adds `result.value_products` (and so `result.norms`) from the same forward: what each
        head moves along its weights (mha.analysis.norms); an encoder-decoder's result adds its decoder's
        and cross attention's (`decoder_value_products`, `cross_value_products`).
        """
        if self.info.seq2seq:
            translated = translate.attend_seq2seq(
                self,
                text,
                text_pair,
                target=target,
                max_new_tokens=max_new_tokens,
                limit=self._max_tokens(max_tokens),
                hidden_state=hidden_state,
                cancel=cancel,
                chat=chat,
                norms=norms,
            )
            maps = [translated.attentions, translated.decoder_attentions, translated.cross_attentions]
            states = [translated.hidden_state, translated.decoder_hidden_state]
            products = [
                translated.value_products,
                translated.decoder_value_products,
                translated.cross_value_products,
            ]
            refuse_non_finite_answer(self.info.name, maps, states, products)
            return translated
        if target is not None:
            raise TargetNotSupportedError(self.info.name, self.info.architecture)
        if max_new_tokens:
            continued = continuation.attend_continued(
                self,
                text,
                text_pair,
                max_new_tokens,
                self._max_tokens(max_tokens),
                hidden_state,
                cancel,
                chat,
                norms=norms,
            )
            refuse_non_finite_answer(
                self.info.name, [continued.attentions], [continued.hidden_state], [continued.value_products]
            )
            return continued
        return self.attend_batch(
            [(text, text_pair)],
            max_tokens=max_tokens,
            hidden_state=hidden_state,
            chat=chat,
            cancel=cancel,
            norms=norms,
        )[0]

    def head_effects(
        self,
        text: str,
        text_pair: str | None = None,
        *,
        max_tokens: int | None = None,
        max_new_tokens: int | None = None,
        target: str | None = None,
        chat: bool = False,
        cancel: Callable[[], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> ablation.HeadEffects:
        """What zeroing each head's output changes downstream (mha.analysis.ablation): a decoder's next-token
        KL (and, with max_new_tokens, at each step that wrote one), an encoder's 1 − cosine of its final
        states, an encoder-decoder's next-token KL along its target (`target`, or the one it writes, as
        attend) for the heads of its three attentions. cancel and progress(layers done, layers) as a
        trace's."""
        limit = self._max_tokens(max_tokens)
        encoded = self.encoder.encode_batch([(text, text_pair)], limit, chat=chat)[0]
        effects = ablation.head_effects(
            self,
            encoded,
            limit=limit,
            max_new_tokens=max_new_tokens,
            target=target,
            cancel=cancel,
            progress=progress,
        )
        sections = (effects.sections or {}).values()
        measured = [
            effects.effects,
            effects.steps,
            effects.pooled,
            *(t for s in sections for t in (s.effects, s.steps)),
        ]
        refuse_non_finite(self.info.name, {"its head effects": [t for t in measured if t is not None]})
        return effects

    # Every head's detection scores on repeated random tokens -> HeadProbe (mha.model.probe).
    probe_heads = probe.probe_heads
    attend_ids = probe.attend_ids  # the AttentionResult of ids as they are: a probe's own input
    attend_probe = probe.attend_probe  # the AttentionResult of the probe's first sequence

    def trace(
        self,
        text: str,
        text_pair: str | None = None,
        *,
        max_tokens: int | None = None,
        overview_size: int | None = OVERVIEW_SIZE,
        chat: bool = False,
        cancel: Callable[[], bool] | None = None,
    ) -> Trace:
        """One forward of a long input that keeps what any window of any head needs (mha.trace.blocked), never
        every head's [n, n]; the overview at `overview_size` is pooled on the way (None: none)."""
        if self.info.seq2seq:
            raise NotImplementedError("a trace of an encoder-decoder is not supported: use attend")
        limit = self._max_tokens(max_tokens)
        encoded = self.encoder.encode_batch([(text, text_pair)], limit, chat=chat)[0]
        tokens = self.tokenizer.convert_ids_to_tokens(encoded.ids)
        return Trace.of(self.network, encoded, tokens, self.info, overview_size=overview_size, cancel=cancel)

    def lm_head(self) -> torch.Tensor:
        """The LM head's weight [V, E] on the model's device, read once; NotCausalError for an encoder."""
        if self._lm_head is None:
            if self._lm_head_loader is None or not (self.info.causal or self.info.seq2seq):
                raise NotCausalError(self.info.name)
            weight = self._lm_head_loader()
            self._lm_head = weight.to(device=self.device, dtype=next(self.network.parameters()).dtype)
        return self._lm_head

    def logits_bias(self) -> torch.Tensor | None:
        """The per-token bias [V] BART and Marian add to the logits, read once; None where there is none."""
        if self._logits_bias is None and self._logits_bias_loader is not None:
            bias = self._logits_bias_loader()
            if bias is None:
                self._logits_bias_loader = None  # absent from the checkpoint: not looked up again
                return None
            self._logits_bias = bias.reshape(-1).to(self.device, next(self.network.parameters()).dtype)
        return self._logits_bias

    def attend_batch(
        self,
        items: Sequence[tuple[str, str | None] | str],
        *,
        max_tokens: int | None = None,
        hidden_state: bool = True,
        chat: bool = False,
        cancel: Callable[[], bool] | None = None,
        norms: bool = False,
        on_device: bool = False,
    ) -> list[AttentionResult]:
        """Several texts (or (text, pair) tuples) in one padded forward; one AttentionResult each.
        `cancel` is checked between layers (see `Transformer.forward`); norms as `attend` says.

        From a CUDA model the results come to the host in one copy (mha._transfer.to_host_packed: each
        text's maps packed on the device, one transfer into pinned memory, one wait, no per-text copy on
        the host), so their tensors are disjoint views of one buffer. on_device=True leaves every result's
        tensors on the model's device instead, each its own (the service quantizes its first view there);
        an encoder-decoder's results are on the host either way."""
        if not items:
            return []
        if self.info.seq2seq:  # each source translated on its own (generation is one sequence at a time)
            pairs = [(i, None) if isinstance(i, str) else i for i in items]
            return [
                self.attend(
                    text, pair, max_tokens=max_tokens, hidden_state=hidden_state, cancel=cancel, norms=norms
                )
                for text, pair in pairs
            ]
        limit = self._max_tokens(max_tokens)
        pairs = [(i, None) if isinstance(i, str) else i for i in items]
        encoded = self.encoder.encode_batch(pairs, limit, chat=chat)
        lengths = [len(e.ids) for e in encoded]
        packed = self.device.type == "cuda" and not on_device
        attentions, hidden, products = self._forward(
            encoded,
            hidden_state=hidden_state,
            cancel=cancel,
            need_products=norms,
            on_device=on_device or packed,
        )
        parts = [
            (
                attentions[:, row, :, :n, :n],  # (L, H, n, n)
                None if hidden is None else hidden[row, :n],  # (n, E)
                None if products is None else products[:, row, :n],  # (L, n, H, H)
            )
            for row, n in enumerate(lengths)
        ]
        refuse_non_finite_answer(
            self.info.name, [m for m, _, _ in parts], [s for _, s, _ in parts], [v for _, _, v in parts]
        )
        if packed:
            parts = rows_to_host(parts)
        return [
            AttentionResult.of(
                e,
                self.tokenizer.convert_ids_to_tokens(e.ids),
                maps,
                state,
                value_products=values,
                shared=packed,
            )
            for e, (maps, state, values) in zip(encoded, parts, strict=True)
        ]

    def forward_padded(
        self,
        encoded: Sequence[Encoded],
        *,
        hidden_state: bool = False,
        cancel: Callable[[], bool] | None = None,
        on_device: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One right-padded forward of encoded inputs: (attentions [L, B, H, T, T], the last hidden state
        [B, T, E] or None), float32 on the CPU (on_device: on the model's device), T the longest input.
        An encoder-decoder runs its encoder alone (its self-attention; no target). Padded keys carry
        weight 0; padded query rows are filler."""
        attentions, hidden, _ = self._forward(
            encoded, hidden_state=hidden_state, cancel=cancel, on_device=on_device
        )
        return attentions, hidden

    def _forward(
        self,
        encoded: Sequence[Encoded],
        *,
        hidden_state: bool = False,
        cancel: Callable[[], bool] | None = None,
        on_device: bool = False,
        need_products: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """forward_padded's forward, with the value products [L, B, T, H, H] when need_products (a
        decoder or encoder; attend_seq2seq keeps an encoder-decoder's)."""
        ids, attention_mask, type_ids = self._padded_inputs(encoded)
        products = None
        # no_grad rather than inference_mode: callers may modify the returned tensors in place.
        with torch.no_grad():
            if isinstance(self.network, EncoderDecoder):
                memory, attentions = self.network.encode(ids, attention_mask=attention_mask, cancel=cancel)
                hidden = memory if hidden_state else None
            else:
                out = self.network(
                    ids,
                    attention_mask=attention_mask,
                    segment_ids=type_ids,
                    need_hidden=hidden_state,
                    cancel=cancel,
                    need_products=need_products,
                )
                attentions, hidden, products = out.attentions, out.hidden_state, out.products
            if attentions is None:  # need_weights is on: the network always returns them
                raise RuntimeError("the network returned no attention weights")
            # One transfer and one cast for the whole batch; a no-op for float32 on the CPU.
            target = attentions.device if on_device else torch.device("cpu")
            attentions = attentions.to(device=target, dtype=torch.float32)
            hidden = None if hidden is None else hidden.to(target, torch.float32)
            products = None if products is None else products.to(target, torch.float32)
        return attentions, hidden, products

    def forward_layers(
        self,
        encoded: Sequence[Encoded],
        on_layers: Callable[..., None],
        *,
        layers_at_once: int = 1,
        cancel: Callable[[], bool] | None = None,
        on_device: bool = False,
        norms: bool = False,
    ) -> None:
        """forward_padded's forward, its weights handed over a few layers at a time: on_layers(first,
        weights [k, B, H, T, T]) with layers first..first + k - 1 (k = layers_at_once, fewer at the end),
        float32 on the CPU (on_device: the model's device), the same values as forward_padded's
        attentions[first : first + k]. Only layers_at_once layers' maps are alive at once, not L; the
        weights may be a buffer the next layers write again, so use them within the call.
        norms=True adds the same layers' value norms ‖f_h(x_j)‖ from the same forward, as attend(...,
        norms=True) gives them (AttentionResult.norms): on_layers(first, weights, norms [k, B, H, T])."""
        ids, attention_mask, type_ids = self._padded_inputs(encoded)
        target = self.device if on_device else torch.device("cpu")

        def handed(first: int, weights: torch.Tensor, products: torch.Tensor | None = None) -> None:
            weights = weights.to(device=target, dtype=torch.float32)
            if products is None:
                on_layers(first, weights)
                return
            # (k, B, T, H, H) -> (k, B, H, T): the root of each diagonal, as mha.networks.result.norms_of
            # takes it
            diagonal = products.to(device=target, dtype=torch.float32).diagonal(dim1=-2, dim2=-1)
            on_layers(first, weights, diagonal.clamp(min=0).sqrt().transpose(-1, -2))

        with torch.no_grad():
            if isinstance(self.network, EncoderDecoder):  # its encoder as forward_padded runs it (encode)
                self.network.encoder(
                    ids,
                    attention_mask=attention_mask,
                    cancel=cancel,
                    on_layers=handed,
                    layers_at_once=layers_at_once,
                    need_products=norms,
                )
            else:
                self.network(
                    ids,
                    attention_mask=attention_mask,
                    segment_ids=type_ids,
                    need_hidden=False,
                    cancel=cancel,
                    on_layers=handed,
                    layers_at_once=layers_at_once,
                    need_products=norms,
                )

    def _padded_inputs(
        self, encoded: Sequence[Encoded]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Encoded inputs right-padded to the longest, on the model's device: ids [B, T], the attention
        mask [B, T] (None when no row is padded), segment ids [B, T] (None for a model without them)."""
        lengths = [len(e.ids) for e in encoded]
        width = max(lengths)
        ids = torch.full((len(encoded), width), self.encoder.pad_id, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        type_ids = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, : len(e.ids)] = torch.tensor(e.ids)
            mask[row, : len(e.ids)] = 1
            type_ids[row, : len(e.ids)] = torch.tensor(e.type_ids)
        # Through pinned memory on CUDA (to_device): the copies queue behind the previous forward's
        # kernels instead of waiting for them.
        attention_mask = to_device(mask, self.device) if min(lengths) < width else None
        segments = to_device(type_ids, self.device) if self.config.type_vocab_size else None
        return to_device(ids, self.device), attention_mask, segments
