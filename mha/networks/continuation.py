"""What a decoder looked at while it wrote: continue a prompt greedily, then its attention over all of it.

The continuation is transformers' generate(do_sample=False): at each step the next token is the argmax of
the LM head over the last position's hidden state (Gemma 2's final soft-cap is monotonic, so it changes no
argmax), stopping after an end-of-sequence token, after `max_new_tokens`, or at the model's length limit.
No sampling settings of a checkpoint's generation_config apply: greedy is greedy. Each step runs the whole
sequence again without attention weights (the fused kernel): k steps of an n-token prompt cost about k
forwards, no KV cache to keep. For a causal model the attention of the final forward over prompt and
continuation is exactly what each step saw: token i was chosen from position i - 1, so row i - 1 is what
the model looked at while writing token i.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from mha.errors import Cancelled, NotCausalError
from mha.networks.model import Transformer
from mha.networks.result import AttentionResult, ModelInfo
from mha.text.tokenize import TextEncoder

__all__ = ["Writer", "attend_continued", "greedy_ids"]


class Writer(Protocol):
    """What continuing a prompt needs of a loaded model (mha.model.attention_model.AttentionModel)."""

    info: ModelInfo
    network: Transformer
    encoder: TextEncoder
    tokenizer: Any
    device: torch.device
    eos_ids: frozenset[int]

    def lm_head(self) -> torch.Tensor: ...


def greedy_ids(
    model: Writer,
    ids: list[int],
    max_new_tokens: int,
    limit: int,
    cancel: Callable[[], bool] | None = None,
) -> list[int]:
    """The token ids greedy decoding appends to `ids` (at most max_new_tokens, ids never beyond `limit`)."""
    if not model.info.causal:
        raise NotCausalError(model.info.name)
    weight = model.lm_head()  # [V, E]
    new: list[int] = []
    with torch.no_grad():
        while len(new) < max_new_tokens and len(ids) + len(new) < limit:
            if cancel is not None and cancel():
                raise Cancelled(f"continuation cancelled after {len(new)} of {max_new_tokens} tokens")
            batch = torch.tensor([ids + new], device=model.device)
            hidden = model.network(batch, need_weights=False, need_hidden=True).hidden_state
            assert hidden is not None  # need_hidden=True
            token = int(torch.argmax(hidden[0, -1] @ weight.T))
            new.append(token)
            if token in model.eos_ids:
                break
    return new


def attend_continued(
    model: Writer,
    text: str,
    text_pair: str | None,
    max_new_tokens: int,
    limit: int,
    hidden_state: bool,
    cancel: Callable[[], bool] | None,
    chat: bool = False,
    *,
    norms: bool = False,
) -> AttentionResult:
    """model.attend(text, max_new_tokens=k): the prompt encoded, continued, then attended in one forward."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) must be at least 0")
    prompt = model.encoder.encode_batch([(text, text_pair)], limit, chat=chat)[0]
    new = greedy_ids(model, prompt.ids, max_new_tokens, limit, cancel)
    encoded = prompt.extended(new, model.encoder)
    ids = encoded.ids
    with torch.no_grad():
        out = model.network(
            torch.tensor([ids], device=model.device),
            need_hidden=hidden_state,
            cancel=cancel,
            need_products=norms,
        )
    assert out.attentions is not None  # need_weights defaults to True
    hidden = None if out.hidden_state is None else out.hidden_state[0].to("cpu", torch.float32)
    return AttentionResult.of(
        encoded,
        model.tokenizer.convert_ids_to_tokens(ids),
        out.attentions[:, 0].to(device="cpu", dtype=torch.float32),
        hidden,
        generated=len(new),
        value_products=None if out.products is None else out.products[:, 0].to("cpu", torch.float32),
    )
