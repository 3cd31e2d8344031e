"""Head ablation: which heads the output needs. Each head's output (its slice of the attention's output,
before the output projection W_O) is set to zero, one head at a time, and the change downstream measured:

- a decoder: KL(p_full ‖ p_ablated) of the next-token distribution, natural log, at the last position;
  with a continuation (max_new_tokens), also at each step that chose a written token;
- an encoder: 1 − cosine similarity of the final hidden state, at the first token ([CLS]) and mean-pooled
  over the tokens (as sentence-transformers pool).

Zeroing head h of layer l changes nothing below l, so the residual stream entering each layer is kept from
one plain forward, and layer l's H ablations run as one batch of H copies (copy b without head b) from
there to the top: Σ_l H·(L − l) layer passes, about half of L·H whole forwards, in batches of H.

The output projection's bias stays: it belongs to no head (mha.analysis.norms). A pre-norm model's final
norm and its LM head (Gemma 2's final soft-cap included) read the ablated stream as they read the plain one.
An encoder-decoder is not taken yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.nn.functional as F

from mha import continuation
from mha.errors import Cancelled, NotCausalError
from mha.layers import Block
from mha.model import Prepared, Transformer
from mha.tokenize import Encoded

if TYPE_CHECKING:
    from mha.pretrained import AttentionModel

__all__ = ["HeadEffects", "head_effects"]

# progress(layers done, layers): called after each layer's H ablations, as a trace reports its layers.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class HeadEffects:
    """What zeroing each head changes. Tensors float32 on the CPU.

    Decoder ("kl"): `effects` [L, H] is KL(p_full ‖ p_ablated) at the last position; `steps` [L, H, k + 1]
    the same at positions prompt_n − 1 .. n − 1 (the steps that chose each of the k written tokens, then
    the next one); `positions` names them; `top_tokens` and `top_probs` the output each KL refers to:
    p_full's most likely token at each of those positions (a written token, then the predicted next one)
    and its probability.
    Encoder ("cosine"): `effects` [L, H] is 1 − cos of the first token's final hidden state; `pooled` [L, H]
    of the mean over the tokens.
    `truncated`: the input was cut to the token limit."""

    tokens: list[str]
    measure: str  # "kl" or "cosine"
    effects: torch.Tensor
    steps: torch.Tensor | None = None
    positions: list[int] | None = None
    pooled: torch.Tensor | None = None
    generated: int = 0
    top_tokens: list[str] | None = None
    top_probs: list[float] | None = None
    truncated: bool = False

    @property
    def layers(self) -> int:
        return int(self.effects.shape[0])

    @property
    def heads(self) -> int:
        return int(self.effects.shape[1])


def head_effects(
    model: AttentionModel,
    encoded: Encoded,
    *,
    limit: int,
    max_new_tokens: int | None = None,
    cancel: Callable[[], bool] | None = None,
    progress: Progress | None = None,
) -> HeadEffects:
    """Every head's effect on the output (module docstring) for one encoded input (AttentionModel.
    head_effects encodes it); `cancel` is asked before each layer's ablations (Cancelled when it answers
    True), `progress` told after each."""
    if model.info.seq2seq:
        raise NotImplementedError("head effects of an encoder-decoder are not computed yet")
    if max_new_tokens and not model.info.causal:  # as attend: only a decoder continues a prompt
        raise NotCausalError(model.info.name)
    generated = 0
    if max_new_tokens and model.info.causal:
        new = continuation.greedy_ids(model, encoded.ids, max_new_tokens, limit, cancel)
        encoded = encoded.extended(new, model.encoder)
        generated = len(new)
    network = cast(Transformer, model.network)
    device = model.device
    ids = torch.tensor([encoded.ids], device=device)
    has_segments = network.embeddings.segment is not None
    segments = torch.tensor([encoded.type_ids], device=device) if has_segments else None
    n = len(encoded.ids)
    reader: Reader = (
        _NextToken(model, network, list(range(n - 1 - generated, n))) if model.info.causal else _FinalStates()
    )
    with torch.no_grad():
        prepared = network.prepare(ids, segment_ids=segments)
        layers = cast("list[Block]", list(network.layers))
        states = []  # the residual stream entering each layer, from the plain forward
        x = prepared.x
        for i, layer in enumerate(layers):
            states.append(x)
            x = _layer(layer, x, prepared, i, None)
        full = reader.read(x)
        heads = network.config.num_heads
        # Copy b of the batch zeroes head b: a (H, H) mask, ones but the diagonal.
        mask = 1 - torch.eye(heads, device=device, dtype=x.dtype)
        per_layer = []
        for start in range(len(layers)):
            if cancel is not None and cancel():
                raise Cancelled(f"head effects cancelled before layer {start} of {len(layers)}")
            x = states[start].expand(heads, *states[start].shape[1:])
            for i in range(start, len(layers)):
                x = _layer(layers[i], x, prepared, i, mask if i == start else None)
            per_layer.append(reader.compare(full, reader.read(x)))  # [H, sides]
            if progress is not None:
                progress(start + 1, len(layers))
    table = torch.stack(per_layer).float().cpu()  # [L, H, sides]
    tokens = model.tokenizer.convert_ids_to_tokens(encoded.ids)
    cut = encoded.truncated
    if isinstance(reader, _NextToken):
        last = table[..., -1].contiguous()
        top = full[0].max(dim=-1)  # p_full's most likely token at each position, as log-probabilities
        return HeadEffects(
            tokens,
            "kl",
            last,
            table,
            reader.positions,
            generated=generated,
            top_tokens=model.tokenizer.convert_ids_to_tokens(top.indices.tolist()),
            top_probs=top.values.exp().tolist(),
            truncated=cut,
        )
    first, pooled = table[..., 0].contiguous(), table[..., 1].contiguous()
    return HeadEffects(tokens, "cosine", first, pooled=pooled, truncated=cut)


def _layer(
    layer: Block, x: torch.Tensor, prepared: Prepared, index: int, head_mask: torch.Tensor | None
) -> torch.Tensor:
    out, _ = layer(
        x,
        prepared.keeps[index],
        rotary=prepared.rotary,
        need_weights=False,
        weights_out=None,
        bias=prepared.bias,
        head_mask=head_mask,
    )
    return out


class Reader(Protocol):
    def read(self, x: torch.Tensor) -> torch.Tensor: ...

    def compare(self, full: torch.Tensor, ablated: torch.Tensor) -> torch.Tensor: ...


class _NextToken:
    """x (B, n, E) -> log-probabilities (B, positions, V) of the next token at `positions`, in float64
    (a KL of nearly equal distributions sums differences of nearly equal numbers); compared as
    KL(p_full ‖ p_ablated), natural log, (B, positions)."""

    def __init__(self, model: AttentionModel, network: Transformer, positions: list[int]) -> None:
        self.positions = positions
        self.norm = network.final_norm
        self.weight = model.lm_head()
        self.bias = model.logits_bias()
        self.softcap = network.config.final_softcap

    def read(self, x: torch.Tensor) -> torch.Tensor:
        h = x[:, self.positions]
        if self.norm is not None:
            h = self.norm(h)
        logits = h @ self.weight.T
        if self.bias is not None:
            logits = logits + self.bias
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return F.log_softmax(logits.double(), dim=-1)

    def compare(self, full: torch.Tensor, ablated: torch.Tensor) -> torch.Tensor:
        return (full.exp() * (full - ablated)).sum(-1)


class _FinalStates:
    """An encoder's output (B, 2, E): the first token's final state and the mean over the tokens, in
    float64; compared as 1 − cosine, (B, 2)."""

    def read(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x[:, 0], x.mean(dim=1)], dim=1).double()

    def compare(self, full: torch.Tensor, ablated: torch.Tensor) -> torch.Tensor:
        return 1 - F.cosine_similarity(full, ablated, dim=-1)
