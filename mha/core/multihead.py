"""MultiHeadAttention: the seeds' module, made general and correct.

Shape legend: B batch, H heads, G query heads per key/value head, T query length, S key length, E embed
dim, D head dim (E // H unless given).

Self-attention projects q, k and v with one fused matmul. Cross-attention projects the key and value
inputs with their own weights (the first seed projected both with the query's slice: a bug), and accepts
key/value inputs of other widths (`kdim`, `vdim`) through separate projections.

What today's decoder families add, each one small piece:
- grouped-query heads: `num_kv_heads` dividing `num_heads` (1: multi-query). K and V are projected once per
  key/value head; the G query heads of a group share them by broadcasting in the matmuls (no repeated
  copy of K or V), and the weights stay per query head, (B, H, T, S). Head h uses key/value head h // G,
  as transformers' repeat_kv orders them.
- `head_dim` other than E // H (Gemma, Qwen3), `scale` other than 1/sqrt(D) (Gemma 2's
  query_pre_attn_scalar), `softcap` on the logits (Gemma 2), `qk_norm_eps` for a per-head RMSNorm of q and
  k (Qwen3; Gemma 3's scales by 1 + w: `qk_norm_offset`), and `out_bias` apart from the q/k/v `bias`
  (Qwen2 has the one without the other).
- rotary positions: `forward(..., rotary=(cos, sin))` rotates q and k (after the q/k norm) as mha.core.rope
says.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mha.core import values
from mha.core.attention import attention_weights, build_keep_mask, scaled_dot_product_attention
from mha.core.norm import RMSNorm
from mha.core.rope import apply_rotary
from mha.core.taps import NO_TAPS, Taps

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention returning (output (B, T, E), per-head weights (B, H, T, S) or None)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        out_bias: bool | None = None,
        scale: float | None = None,
        softcap: float | None = None,
        qk_norm_eps: float | None = None,
        qk_norm_offset: float = 0.0,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if embed_dim <= 0 or num_heads <= 0 or num_kv_heads <= 0:
            raise ValueError(
                f"embed_dim ({embed_dim}), num_heads ({num_heads}) and num_kv_heads ({num_kv_heads}) "
                "must be positive"
            )
        if head_dim is None and embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) is not divisible by num_heads ({num_heads})")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) is not divisible by num_kv_heads ({num_kv_heads})")
        if head_dim is not None and head_dim <= 0:
            raise ValueError(f"head_dim ({head_dim}) must be positive")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout ({dropout}) must be in [0, 1)")
        if softcap is not None and softcap <= 0:
            raise ValueError(f"softcap ({softcap}) must be positive")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = embed_dim // num_heads if head_dim is None else head_dim
        self.scale = self.head_dim**-0.5 if scale is None else scale
        self.softcap = softcap
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.dropout = dropout
        q_width, kv_width = num_heads * self.head_dim, num_kv_heads * self.head_dim
        self.widths = (q_width, kv_width, kv_width)  # of q, k and v
        # The classic module (what torch.nn.MultiheadAttention is): its own fast single-sequence path.
        self.classic = num_kv_heads == num_heads and q_width == embed_dim and qk_norm_eps is None
        self.fused = self.kdim == embed_dim and self.vdim == embed_dim
        if self.fused:
            self.in_proj = nn.Linear(embed_dim, sum(self.widths), bias=bias)  # rows: q, k, v
        else:
            self.q_proj = nn.Linear(embed_dim, q_width, bias=bias)
            self.k_proj = nn.Linear(self.kdim, kv_width, bias=bias)
            self.v_proj = nn.Linear(self.vdim, kv_width, bias=bias)
        self.out_proj = nn.Linear(q_width, embed_dim, bias=bias if out_bias is None else out_bias)
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(self.head_dim, eps=qk_norm_eps, offset=qk_norm_offset)
            self.k_norm = RMSNorm(self.head_dim, eps=qk_norm_eps, offset=qk_norm_offset)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights (each of q, k, v on its own fan), zero biases."""
        if self.fused:
            for part in self.in_proj.weight.data.split(self.widths, dim=0):
                nn.init.xavier_uniform_(part)
            projections = [self.in_proj, self.out_proj]
        else:
            projections = [self.q_proj, self.k_proj, self.v_proj, self.out_proj]
            for lin in projections[:3]:
                nn.init.xavier_uniform_(lin.weight)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for lin in projections:
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def _project(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        self_attention: bool,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.fused and self_attention:
            # (B, T, q + k + v widths): one matmul for all three; `rows`, on the real tokens alone
            qkv = self.in_proj(query) if rows is None else _on_rows(self.in_proj, query, rows)
            return qkv.split(self.widths, dim=-1)  # type: ignore[return-value]
        if self.fused:
            w_q, w_k, w_v = self.in_proj.weight.split(self.widths, dim=0)
            b = self.in_proj.bias
            b_q, b_k, b_v = b.split(self.widths) if b is not None else (None, None, None)
            return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        return self.q_proj(query), self.k_proj(key), self.v_proj(value)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        causal: bool = False,
        mask: torch.Tensor | None = None,
        valid_lens: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        bias: torch.Tensor | None = None,
        need_weights: bool = True,
        taps: Taps = NO_TAPS,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from `query` (B, T, E) to `key` (B, S, kdim), `value` (B, S, vdim); omitted: self-attention.

        causal: query i sees keys 0..i.
        mask: 0/1 or bool keep-mask broadcastable from (S), (T, S), (B, T, S) or (B, 1|H, T, S).
        valid_lens: (B) or (B, T), keys at index >= the length are masked (d2l style).
        All three combine. A query with no key left gets zeros.
        keep: instead of those three, the bool (B|1, H|1, T, S) mask `build_keep_mask` returns: a model
        builds it once for all its layers, and no layer normalises it again.
        rotary: (cos, sin), each (B|1, T, rotary dim), rotating q and k (mha.core.rope; self-attention only).
        bias: added to the logits, broadcastable to (B, H, T, S): T5's relative position bias.
        taps: what an analysis reads out or changes (mha.core.taps): the weights' buffer, the value
        products, a head mask, a padded batch's real rows (self-attention only; a padded key's value
        products are 0 too).
        """
        key, value = self._check_inputs(query, key, value)
        self_attention = key is query and value is query
        keep = self._keep_mask(query, key, mask=mask, valid_lens=valid_lens, causal=causal, keep=keep)
        plain = rotary is None and bias is None and taps.head_mask is None
        if need_weights and plain and self._single_sequence(query, self_attention):
            return self._single_self_attention(query, keep, taps.weights_out, taps.products_out)

        rows = taps.rows if self_attention else None
        q, k, v = self.heads(query, key, value, self_attention, rotary, rows=rows)  # (B, H|H_kv, T|S, D)
        if taps.products_out is not None:
            self.value_products(v, out=taps.products_out)
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            keep_mask=keep,
            dropout_p=self.dropout,
            training=self.training,
            scale=self.scale,
            softcap=self.softcap,
            need_weights=need_weights,
            weights_out=taps.weights_out,
            bias=bias,
        )  # (B, H, T, D)
        if taps.head_mask is not None:
            out = out * taps.head_mask.to(out.dtype)[:, :, None, None]  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(query.shape[0], query.shape[1], self.widths[0])  # (B, T, H·D)
        return (self.out_proj(out) if rows is None else _on_rows(self.out_proj, out, rows)), weights

    def heads(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        self_attention: bool,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        *,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, D), k and v (B, H_kv, S, D): projected, split into heads, q/k-normed, rotated."""
        q, k, v = self._project(query, key, value, self_attention, rows)  # (B, T|S, widths)
        q = self._split_heads(q, self.num_heads)
        k = self._split_heads(k, self.num_kv_heads)
        v = self._split_heads(v, self.num_kv_heads)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            if not self_attention:
                raise ValueError("rotary positions apply to self-attention only")
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        return q, k, v

    def attention_weights(
        self,
        x: torch.Tensor,
        *,
        causal: bool = False,
        mask: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        weights_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention weights (B, H, T, T) alone, for a layer whose output nobody reads (a model's
        last layer when only attention is asked). On one sequence in inference it skips the value
        projection, the weighted sum and out_proj; otherwise it is `forward`'s weights."""
        self._check_inputs(x, None, None)
        keep = self._keep_mask(x, x, mask=mask, valid_lens=None, causal=causal, keep=keep)
        if rotary is None and self._single_sequence(x, self_attention=True):
            return self._single_weights(x, keep, weights_out, with_values=False)[1].unsqueeze(0)
        if not (self.training and self.dropout > 0) and not torch.is_grad_enabled():
            # No value path: q and k alone (the value projection of a fused layer is computed and dropped).
            q, k, _ = self.heads(x, x, x, True, rotary)
            return attention_weights(q, k, keep, scale=self.scale, softcap=self.softcap, out=weights_out)
        weights = self(x, keep=keep, rotary=rotary, taps=Taps(weights_out=weights_out))[1]
        assert weights is not None  # need_weights=True always gives weights
        return weights

    def _check_inputs(
        self, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(key, value), the omitted ones filled in as forward's docstring says, once all three shapes fit."""
        if key is None:
            key = query if value is None else value
        if value is None:
            value = key
        if query.ndim != 3 or query.shape[-1] != self.embed_dim:
            raise ValueError(f"query must have shape (B, T, {self.embed_dim}), got {tuple(query.shape)}")
        batch = query.shape[0]
        if key.ndim != 3 or key.shape[0] != batch or key.shape[-1] != self.kdim:
            raise ValueError(f"key must have shape ({batch}, S, {self.kdim}), got {tuple(key.shape)}")
        if value.ndim != 3 or value.shape[:2] != key.shape[:2] or value.shape[-1] != self.vdim:
            raise ValueError(
                f"value must have shape ({batch}, {key.shape[1]}, {self.vdim}), got {tuple(value.shape)}"
            )
        return key, value

    def _keep_mask(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        valid_lens: torch.Tensor | None,
        causal: bool,
        keep: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """The public mask forms normalised once, at the module boundary; a ready `keep` passes through."""
        if keep is None:
            return build_keep_mask(
                mask=mask,
                valid_lens=valid_lens,
                causal=causal,
                batch=query.shape[0],
                heads=self.num_heads,
                tgt_len=query.shape[1],
                src_len=key.shape[1],
                device=query.device,
            )
        if mask is not None or valid_lens is not None or causal:
            raise ValueError("keep replaces mask, valid_lens and causal: pass either keep or those")
        if keep.dtype != torch.bool or keep.ndim != 4:
            raise ValueError(
                f"keep must be a 4-D bool mask as build_keep_mask returns, got {keep.dtype} "
                f"of shape {tuple(keep.shape)}"
            )
        return keep

    def _single_sequence(self, query: torch.Tensor, self_attention: bool) -> bool:
        """Whether the copy-free single-sequence path applies: self-attention on one sequence with the
        fused projection, no dropout to draw and no gradient to keep (the path writes in place)."""
        return (
            self_attention
            and self.classic
            and self.softcap is None
            and self.fused
            and query.shape[0] == 1
            and not (self.training and self.dropout > 0)
            and not (torch.is_grad_enabled() and (query.requires_grad or self.in_proj.weight.requires_grad))
        )

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """(B, L, heads·D) -> (B, heads, L, D), a view."""
        return x.view(x.shape[0], x.shape[1], heads, self.head_dim).transpose(1, 2)

    def values(self, value: torch.Tensor) -> torch.Tensor:
        """v (B, H_kv, S, D) of `value` (B, S, vdim) alone: the value projection with its bias, for a layer
        whose output nobody reads but whose value products are asked for (Transformer.forward)."""
        if self.fused:
            start = self.widths[0] + self.widths[1]
            bias = None if self.in_proj.bias is None else self.in_proj.bias[start:]
            v = F.linear(value, self.in_proj.weight[start:], bias)
        else:
            v = self.v_proj(value)
        return self._split_heads(v, self.num_kv_heads)

    def value_products(self, v: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """(B, S, H, H): every key's values through each pair of heads' slices of out_proj, from v (B, H_kv,
        S, D) as `heads` gives it (mha.core.values.value_products, which says what they are)."""
        return values.value_products(v, self.out_proj.weight, self.num_heads, out=out)

    def value_norms(self, v: torch.Tensor) -> torch.Tensor:
        """(B, H, S): ‖f_h(x_j)‖, the diagonal of `value_products` without the pairs
        (mha.core.values.value_norms)."""
        return values.value_norms(v, self.out_proj.weight, self.num_heads)

    def _single_self_attention(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        weights_out: torch.Tensor | None,
        products_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference on one sequence with no copies: the path `attend` takes.

        Projecting to the transpose, (3E, T), leaves every head's q^T, k^T and v^T contiguous, so both
        attention matmuls read them in place (BLAS takes the transposed views as they are) and the
        output comes back as (E, T), whose transpose out_proj reads in place too.
        """
        v_t, weights = self._single_weights(x, keep, weights_out, with_values=True)
        assert v_t is not None  # with_values=True projects v: an invariant, not user input
        if products_out is not None:
            self.value_products(v_t.transpose(1, 2).unsqueeze(0), out=products_out)  # v (1, H, T, D)
        length = x.shape[1]
        out_t = torch.bmm(v_t, weights.transpose(1, 2))  # (H, D, T) = v^T w^T
        out = self.out_proj(out_t.view(self.embed_dim, length).t())  # (T, E)
        return out.unsqueeze(0), weights.unsqueeze(0)  # (1, T, E), (1, H, T, T)

    def _single_weights(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        weights_out: torch.Tensor | None,
        *,
        with_values: bool,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(v^T (H, D, T) or None, weights (H, T, T)) for one sequence; without values only q and k are
        projected (the leading 2E rows of the fused weight, a contiguous view)."""
        length, heads, head_dim = x.shape[1], self.num_heads, self.head_dim
        parts = 3 if with_values else 2
        w = self.in_proj.weight[: parts * self.embed_dim]
        b = self.in_proj.bias[: parts * self.embed_dim] if self.in_proj.bias is not None else None
        x_t = x[0].t()  # (E, T) view
        qkv_t = torch.addmm(b.unsqueeze(1), w, x_t) if b is not None else w @ x_t  # (parts·E, T)
        q_t, k_t, *v_t = qkv_t.view(parts, heads, head_dim, length).unbind(0)  # each (H, D, T)
        weights = attention_weights(
            q_t.transpose(1, 2),  # (H, T, D)
            k_t.transpose(1, 2),  # (H, T, D), whose transpose back the matmul reads in place
            None if keep is None else keep[0],
            scale=self.scale,
            out=None if weights_out is None else weights_out[0],
        )  # (H, T, T)
        return (v_t[0] if v_t else None), weights


def _on_rows(linear: nn.Module, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """linear(x) for x (B, T, in) on the B·T rows `rows` alone, 0 on the others: (B, T, out)."""
    real = linear(x.reshape(-1, x.shape[-1]).index_select(0, rows))
    out = real.new_zeros(x.shape[0] * x.shape[1], real.shape[-1])
    return out.index_copy_(0, rows, real).view(x.shape[0], x.shape[1], -1)
