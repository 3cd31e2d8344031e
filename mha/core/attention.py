"""The attention core: keep-masks, and the one function that turns q and k into weights.

Shape legend: B batch, H heads, T query length, S key length, D head dim.

Masks here are *keep*-masks: True (or 1) means "this query may look at this key". They arrive in the
forms the seed texts use and are normalised once (`build_keep_mask`) to one boolean tensor broadcastable
to (B, H, T, S). Then every path runs the same steps, in `attention_weights`: scores = q k^T * scale ->
soft-cap -> + bias -> mask -> softmax -> rows with no key zeroed (`masked_softmax`). `eager_attention` is
transformers' eager_attention_forward on top of it (weights, dropout, @ v); `scaled_dot_product_attention`
takes it, or hands a weights-free call to torch's fused kernel.

Grouped-query heads (H_kv key/value heads, G = H // H_kv query heads each) are lined up by views, not by
transformers' repeat_kv copies: q (B, H, T, D) is read as (B, H_kv, G, T, D) against k (B, H_kv, 1, S, D).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "attention_scores",
    "attention_weights",
    "band_keep",
    "build_keep_mask",
    "eager_attention",
    "empty_rows",
    "masked_softmax",
    "normalize_mask",
    "scaled_dot_product_attention",
    "valid_lens_mask",
]


def normalize_mask(mask: torch.Tensor, *, batch: int, heads: int, tgt_len: int, src_len: int) -> torch.Tensor:
    """A 0/1 or bool keep-mask of shape (S), (T, S), (B, T, S) or (B, 1|H, T, S) -> bool, 4-D."""
    if mask.dtype != torch.bool:
        if mask.is_floating_point() or mask.dtype in (
            torch.int8,
            torch.int16,
            torch.int32,
            torch.int64,
            torch.uint8,
        ):
            bad = mask[(mask != 0) & (mask != 1)]
            if bad.numel():
                raise ValueError(
                    f"mask must be a 0/1 or boolean keep-mask, got the value {bad.flatten()[0].item()!r}"
                )
            mask = mask != 0
        else:
            raise ValueError(f"mask must be a 0/1 or boolean keep-mask, got dtype {mask.dtype}")
    if mask.ndim == 1:
        mask = mask.view(1, 1, 1, -1)  # (S) -> (1, 1, 1, S)
    elif mask.ndim == 2:
        mask = mask.view(1, 1, *mask.shape)  # (T, S) -> (1, 1, T, S)
    elif mask.ndim == 3:
        mask = mask.unsqueeze(1)  # (B, T, S) -> (B, 1, T, S)
    elif mask.ndim != 4:
        raise ValueError(f"mask must have 1 to 4 dimensions, got shape {tuple(mask.shape)}")
    target = (batch, heads, tgt_len, src_len)
    try:
        if torch.broadcast_shapes(mask.shape, target) != target:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, T, S) = {target}"
        ) from None
    return mask


def valid_lens_mask(valid_lens: torch.Tensor, *, batch: int, tgt_len: int, src_len: int) -> torch.Tensor:
    """d2l-style valid lengths, (B) or (B, T): keys at index >= the length are masked -> bool, 4-D."""
    if (
        valid_lens.ndim not in (1, 2)
        or valid_lens.shape[0] != batch
        or (valid_lens.ndim == 2 and valid_lens.shape[1] != tgt_len)
    ):
        raise ValueError(
            f"valid_lens must have shape (B,) = ({batch},) or (B, T) = ({batch}, {tgt_len}), "
            f"got {tuple(valid_lens.shape)}"
        )
    keys = torch.arange(src_len, device=valid_lens.device)
    keep = keys < valid_lens.unsqueeze(-1)  # (B, S) or (B, T, S)
    return keep.view(batch, 1, 1, src_len) if valid_lens.ndim == 1 else keep.unsqueeze(1)


def build_keep_mask(
    *,
    mask: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
    causal: bool = False,
    window: int | None = None,
    batch: int,
    heads: int,
    tgt_len: int,
    src_len: int,
    device: torch.device | str,
) -> torch.Tensor | None:
    """A keep-mask, valid lengths, a causal flag and a sliding window combined into one bool mask; None if
    nothing is masked. `window` W keeps query i's keys j > i - W (the W latest, itself included, as
    transformers' sliding_window_overlay); with `causal`, the sliding-window attention of Mistral, Gemma 2."""
    keep: torch.Tensor | None = None
    if mask is not None:
        keep = normalize_mask(mask.to(device), batch=batch, heads=heads, tgt_len=tgt_len, src_len=src_len)
    if valid_lens is not None:
        lens = valid_lens_mask(valid_lens.to(device), batch=batch, tgt_len=tgt_len, src_len=src_len)
        keep = lens if keep is None else keep & lens
    band = band_keep((0, tgt_len), (0, src_len), causal=causal, window=window, device=device)
    if band is not None:
        band = band.view(1, 1, tgt_len, src_len)
        keep = band if keep is None else keep & band
    return keep


def band_keep(
    rows: tuple[int, int],
    cols: tuple[int, int],
    *,
    causal: bool,
    window: int | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor | None:
    """(q1 - q0, k1 - k0) bool keep-mask of one sequence's query rows q0..q1-1 against its keys k0..k1-1:
    with `causal` key j <= query i (top-left aligned, as torch's is_causal); with `window` W also
    j > i - W (the W latest keys, itself included, as transformers' sliding_window_overlay). Any block of
    the full mask is built alone, so long inputs never hold all T x S of it. None when nothing is masked."""
    if window is not None and window < 1:
        raise ValueError(f"window ({window}) must be at least 1")
    if not causal and window is None:
        return None
    i = torch.arange(*rows, device=device).view(-1, 1)
    j = torch.arange(*cols, device=device).view(1, -1)
    keep = j <= i if causal else None
    if window is not None:
        recent = j > i - window
        keep = recent if keep is None else keep & recent
    return keep


def empty_rows(keep: torch.Tensor | None) -> torch.Tensor | None:
    """(..., T, 1) True where a query row keeps no key at all; None when no row is empty (one check, on
    the CPU: on an accelerator it would wait for the device every layer, so the mask is returned as is,
    and zeroing its rows, all False or not, gives the same weights)."""
    if keep is None:
        return None
    empty = ~keep.any(dim=-1, keepdim=True)
    if keep.device.type != "cpu":
        return empty
    return empty if bool(empty.any()) else None


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    keep: torch.Tensor | None = None,
    *,
    scale: float,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale, masked by `keep`) over the keys: the one place scores become weights.

    q (..., T, D), k (..., S, D), keep a bool keep-mask broadcastable to (..., T, S) -> (..., T, S). Every
    path ends here (batched, one sequence, weights alone), so a new piece plugs in once: `softcap` is
    Gemma 2's cap * tanh(logits / cap), before the mask as there; grouped-query keys would be repeated
    per group at the top; rotary embeddings and sliding windows act before the call (on q and k, and in
    `build_keep_mask`). A query row whose keys are all masked gets zero weights, never NaN. Without
    autograd the weights are written into `out` if given (a contiguous (..., T, S) slice of a model's
    stacked buffer), else over the scores: no extra pass. `bias`, broadcastable to (..., T, S), is added to
    the scores before the mask: T5's relative position bias (mha.core.relative).
    """
    if q.ndim == 4 and k.shape[1] != q.shape[1]:  # grouped-query heads: (B, H_kv, G, T, S) views
        kv_heads = k.shape[1]
        weights = attention_weights(
            _by_group(q, kv_heads),
            k.unsqueeze(2),  # (B, H_kv, 1, S, D)
            None if keep is None else _by_group(keep, kv_heads),
            scale=scale,
            softcap=softcap,
            out=None if out is None else _by_group(out, kv_heads),
            bias=None if bias is None else _by_group(bias, kv_heads),
        )
        return weights.flatten(1, 2)  # (B, H, T, S)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or _needs_grad(bias))
    if bias is None and not grad and softcap is None and keep is not None and keep.shape[:-2].numel() == 1:
        return _biased_weights(q, k, keep, scale=scale, out=out)
    scores = attention_scores(q, k, scale=scale, softcap=softcap, out=None if grad else out)
    if bias is not None:
        scores = scores + bias if grad else scores.add_(bias)
    return masked_softmax(scores, keep, out=None if grad else out)


def _needs_grad(t: torch.Tensor | None) -> bool:
    return t is not None and t.requires_grad


def _by_group(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B|1, H|1, ...) -> (B|1, H_kv|1, G|1, ...), a view: query head h at [h // G, h % G], the order of
    transformers' repeat_kv, so the key/value head each group shares broadcasts over its G heads."""
    if x.shape[1] == 1:
        return x.unsqueeze(2)
    return x.view(x.shape[0], kv_heads, x.shape[1] // kv_heads, *x.shape[2:])


def attention_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: float,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logits softmax reads, q k^T * scale, soft-capped: (..., T, S), unmasked. Written into `out` if
    given (no autograd). `attention_weights` and a trace's windows (mha.trace.windows) both start here."""
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    if q.ndim == 3 and not grad:
        # One sequence, (H, T, D): the scale rides on the matmul (BLAS alpha), written straight into `out`.
        scores = q.new_empty(q.shape[0], q.shape[1], k.shape[1]) if out is None else out
        torch.baddbmm(scores, q, k.transpose(1, 2), beta=0.0, alpha=scale, out=scores)
    else:
        # baddbmm is 3-D only, and folding (B, H) into one dim would copy q and k: one pass for the scale.
        scores = torch.matmul(q, k.transpose(-2, -1)).mul_(scale)  # (..., T, S)
    if softcap is not None:
        # tanh's backward reads its output, so autograd needs the out-of-place form.
        scores = (scores / softcap).tanh() * softcap if grad else scores.div_(softcap).tanh_().mul_(softcap)
    return scores


def _biased_weights(
    q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor, *, scale: float, out: torch.Tensor | None
) -> torch.Tensor:
    """attention_weights for one keep-mask shared by every sequence and head (a decoder's causal or
    sliding-window triangle): the mask enters the GEMM as an additive bias, C = bias + scale·q kᵀ, so the
    scores see one pass fewer than scale, then mask; rows with no key kept are zeroed as everywhere."""
    length, src, dim = q.shape[-2], k.shape[-2], q.shape[-1]
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q3 = q.expand(*lead, length, dim).reshape(-1, length, dim)
    k3 = k.expand(*lead, src, dim).reshape(-1, src, dim)  # a copy only for grouped heads (K is small)
    drop = ~keep.reshape(1, *keep.shape[-2:])  # (1, T or 1, S): broadcast by baddbmm
    bias = torch.zeros(drop.shape, dtype=q.dtype, device=q.device).masked_fill_(
        drop, torch.finfo(q.dtype).min
    )
    scores = q.new_empty(*lead, length, src) if out is None else out
    flat = scores.view(-1, length, src)
    torch.baddbmm(bias, q3, k3.transpose(1, 2), alpha=scale, out=flat)
    return masked_softmax(scores, keep, biased=True)


def masked_softmax(
    scores: torch.Tensor, keep: torch.Tensor | None, *, out: torch.Tensor | None = None, biased: bool = False
) -> torch.Tensor:
    """softmax over the last dim where `keep` is True; rows with no key kept give zeros, never NaN.

    In place (into `out`, or over `scores`) unless autograd needs softmax's output intact. `biased`: the
    scores already carry the mask as an additive bias (the lowest finite value where `keep` is False).
    """
    empty = empty_rows(keep)
    if keep is not None and not biased:
        # The dtype's lowest finite value, not -inf, as Hugging Face does: exp underflows to exactly 0 and a
        # fully masked row stays finite (its gradients too) until it is zeroed below.
        scores.masked_fill_(~keep, torch.finfo(scores.dtype).min)
    if torch.is_grad_enabled() and scores.requires_grad:
        weights = torch.softmax(scores, dim=-1)
        return weights if empty is None else weights.masked_fill(empty, 0.0)
    weights = torch.softmax(scores, dim=-1, out=scores if out is None else out)
    return weights if empty is None else weights.masked_fill_(empty, 0.0)


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None = None,
    *,
    scale: float,
    softcap: float | None = None,
    bias: torch.Tensor | None = None,
    dropout: float = 0.0,
    weights_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager_attention_forward: (output (B, H, T, D), weights (B, H, T, S)) for q (B, H, T, D),
    k and v (B, H_kv, S, D). `attention_weights` (q k^T * scale, soft-cap, + bias, mask, softmax), dropout,
    @ v; `weights_out` a contiguous (B, H, T, S) buffer the weights are written into."""
    weights = attention_weights(q, k, keep, scale=scale, softcap=softcap, out=weights_out, bias=bias)
    if dropout > 0:
        # As torch.nn.MultiheadAttention: the weights returned are the ones the values were mixed with.
        weights = F.dropout(weights, p=dropout, training=True)
        if weights_out is not None and not weights.requires_grad:
            weights_out.copy_(weights)
    if k.shape[1] == q.shape[1]:
        return torch.matmul(weights, v), weights
    out = torch.matmul(_by_group(weights, k.shape[1]), v.unsqueeze(2))  # (B, H_kv, G, T, D)
    return out.flatten(1, 2), weights  # (B, H, T, D)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    keep_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    need_weights: bool = True,
    weights_out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T * scale + bias, masked) v for q (B, H, T, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv).

    Returns (output (B, H, T, Dv), weights (B, H, T, S) or None when need_weights is False). A query row
    whose keys are all masked gives zero weights and a zero output, never NaN. `weights_out`, if given,
    is a contiguous (B, H, T, S) buffer the weights are written into (saves a copy when a model stacks
    every layer's weights).
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    dropout = dropout_p if training else 0.0
    if not need_weights and softcap is None and k.shape[1] == q.shape[1]:
        # torch's fused kernel: no (B, H, T, S) weights kept. It has no soft-cap, hence the condition. A
        # bias goes in as a float mask, the masked keys at the dtype's lowest value as in masked_softmax.
        attn_mask = keep_mask
        if bias is not None:
            low = torch.finfo(bias.dtype).min
            attn_mask = bias if keep_mask is None else torch.where(keep_mask, bias, low)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scale)
        empty = empty_rows(keep_mask)
        return (out if empty is None else out.masked_fill(empty, 0.0)), None
    out, weights = eager_attention(
        q, k, v, keep_mask, scale=scale, softcap=softcap, bias=bias, dropout=dropout, weights_out=weights_out
    )
    return out, (weights if need_weights else None)
