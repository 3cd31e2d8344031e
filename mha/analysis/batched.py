"""``head_stats`` and ``head_labels`` for a whole padded batch at once, for corpus runs.

Shape legend: B texts, L layers, H heads, T the batch's padded length, n_b text b's own length, M maps
(B·L·H flattened). Text b's map is ``attentions[b, l, h, :n_b, :n_b]``; its padded keys (j >= n_b) carry
weight 0 (the forward masks them) and its padded query rows (i >= n_b) are left out of every mean.

The definitions are ``mha.analysis.stats``'s, computed the same way (row kernels, then a mean over the
rows); only the order of the float sums differs (a row sums T terms where the text alone sums n_b, and a
mean is a masked sum over T rows divided by the count), so a statistic agrees with ``head_stats`` on the
text alone within float32 rounding of those sums. The work runs in chunks of whole maps on the
attention's own device (a GPU keeps it), so a batch of long texts never needs more than a few tiles of
scratch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from mha._transfer import to_device
from mha.analysis import stats as definitions
from mha.analysis.detection import DETECTION_MARGIN, DETECTION_THRESHOLD, KINDS

__all__ = ["STATS", "BatchStats", "batch_head_labels", "batch_head_stats"]

# head_stats' keys, in its order: entropy (left out of similarity, as it grows with n), then the others
# but the detection scores (mha.analysis.detection), which read token ids, not these row kernels.
STATS = ("entropy", *(key for key in definitions.SIMILARITY_STATS if key not in KINDS))

# Weights per chunk of maps (16 MiB of float32 per temporary): bounded scratch at any T, and big enough
# that a chunk is one set of vectorized ops over many maps. 64 MiB chunks made one 512-token text of a
# corpus cost ~100 MiB over 20-60-token batches (benchmarks/corpus_memory.py), and were slower on the CPU:
# one thread, best of 7, 32 x 60 tokens 62.6 -> 55.4 ms, 1 x 512 134.6 -> 96.8 ms, 4 x 512 515 -> 388 ms.
_CHUNK_ELEMENTS = 1 << 22


def batch_head_stats(
    attentions: Tensor,
    lengths: Sequence[int] | Tensor,
    *,
    special: Tensor,
    punctuation: Tensor,
    causal: bool,
) -> dict[str, Tensor]:
    """Each ``head_stats`` statistic of each text of a padded batch: attentions [B, L, H, T, T] ->
    {stat: Tensor [B, L, H]} (float32, on the attentions' device).

    ``lengths`` [B] the texts' token counts; ``special`` and ``punctuation`` [B, T] bool token masks
    (``stats.token_masks`` per text; False on padding); ``causal`` as head_stats takes it (only
    ``entropy_norm`` uses it).
    """
    if attentions.ndim != 5 or attentions.shape[-1] != attentions.shape[-2]:
        raise ValueError(f"attentions must be shaped [B, L, H, T, T], got {tuple(attentions.shape)}")
    stats = BatchStats(
        lengths,
        special=special,
        punctuation=punctuation,
        causal=causal,
        batch=attentions.shape[0],
        width=attentions.shape[-1],
        device=attentions.device,
        dtype=attentions.dtype,
    )
    return stats(attentions)


class BatchStats:
    """``batch_head_stats`` of one batch's texts, prepared once for many calls: ``BatchStats(lengths, *,
    special, punctuation, causal, batch, width, device, dtype)(attentions [B, L, H, T, T])``, any L (the
    corpus worker's one layer at a time). The lengths are checked and copied to the device and the masks
    and kernels built here, once, so a call is the maps' own work alone: on a GPU it never waits for the
    device (a check or a copy from the host would, between every two layers of the forward)."""

    def __init__(
        self,
        lengths: Sequence[int] | Tensor,
        *,
        special: Tensor,
        punctuation: Tensor,
        causal: bool,
        batch: int,
        width: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        n = torch.as_tensor(lengths).to(torch.long)
        if n.shape != (batch,) or bool((n < 1).any()) or bool((n > width).any()):
            raise ValueError(f"lengths must be {batch} values in 1..{width}, got {n.tolist()}")
        for name, mask in (("special", special), ("punctuation", punctuation)):
            if tuple(mask.shape) != (batch, width):
                raise ValueError(f"{name} must be shaped [{batch}, {width}], got {tuple(mask.shape)}")
        self.batch, self.width, self.causal, self.dtype = batch, width, causal, dtype
        # Host -> device through pinned memory on CUDA: queued, so the host never waits for the forward.
        self.n = to_device(n, device)  # (B,)
        # Each text's key masks as float columns, for one batched matmul per chunk: (B, T, 2).
        self.columns = to_device(torch.stack([special, punctuation], dim=-1).to(dtype), device)
        self.positions = torch.arange(width, device=device)
        offsets = self.positions[None, :] - self.positions[:, None]  # [T, T] j - i
        # Row i's weights on |i - j|, on j > i and on |i - j| <= LOCAL_WINDOW: one pass over the maps
        # (an einsum, a batched matmul per row) instead of three multiply-and-sum passes.
        near = offsets.abs() <= definitions.LOCAL_WINDOW
        self.kernels = torch.stack([offsets.abs(), offsets > 0, near], dim=-1).to(dtype)  # [T, T, 3]

    def __call__(self, attentions: Tensor, *, layer_major: bool = False) -> dict[str, Tensor]:
        """{stat: Tensor [B, L, H]} of attentions [B, L, H, T, T] (float32, on the prepared device);
        ``layer_major``: attentions [L, B, H, T, T], as a forward writes them (no copy to reorder)."""
        return dict(zip(STATS, self.stacked(attentions, layer_major=layer_major), strict=True))

    def stacked(self, attentions: Tensor, *, layer_major: bool = False) -> Tensor:
        """The same statistics as one tensor [S, B, L, H], S in STATS order (one copy to move, not S)."""
        self._check(attentions, layer_major)
        if layer_major:
            layers, batch, heads, width, _ = attentions.shape
        else:
            batch, layers, heads, width, _ = attentions.shape
        maps = attentions.reshape(-1, width, width)  # (M, T, T)
        # Per map: its text's length and key masks (M = L·B·H layer-major, else B·L·H).
        if layer_major:
            map_n = self.n.repeat_interleave(heads).repeat(layers)  # (M,)
            columns = self.columns.repeat_interleave(heads, dim=0).repeat(layers, 1, 1)  # (M, T, 2)
        else:
            map_n = self.n.repeat_interleave(layers * heads)
            columns = self.columns.repeat_interleave(layers * heads, dim=0)
        out = self._means(self._row_values(maps, columns), maps, map_n)  # (S, M)
        if layer_major:
            return out.view(len(STATS), layers, batch, heads).transpose(1, 2)
        return out.view(len(STATS), batch, layers, heads)

    def _check(self, attentions: Tensor, layer_major: bool) -> None:
        shape = (self.batch, self.width, self.width)
        text_dim = 1 if layer_major else 0
        if attentions.ndim != 5 or (attentions.shape[text_dim], *attentions.shape[-2:]) != shape:
            order = "L, B" if layer_major else "B, L"
            raise ValueError(
                f"attentions must be shaped [{order}, H, T, T] with B {self.batch} and T {self.width}, "
                f"got {tuple(attentions.shape)}"
            )
        if attentions.dtype != self.dtype or attentions.device != self.n.device:
            raise ValueError(
                f"attentions are {attentions.dtype} on {attentions.device}, prepared for {self.dtype} on "
                f"{self.n.device}"
            )

    def _row_values(self, maps: Tensor, columns: Tensor) -> Tensor:
        """(9, M, T): each query row's entropy (nats), distance, forward, local, max, special, punctuation,
        self and first weights, for maps (M, T, T) with their key masks columns (M, T, 2), a chunk of whole
        maps at a time."""
        width, dtype = maps.shape[-1], maps.dtype
        rows = torch.empty(9, maps.shape[0], width, dtype=dtype, device=maps.device)
        per_chunk = max(1, _CHUNK_ELEMENTS // (width * width))
        for start in range(0, maps.shape[0], per_chunk):
            chunk = maps[start : start + per_chunk]  # (C, T, T)
            part = slice(start, start + chunk.shape[0])
            work = torch.clamp(chunk, min=torch.finfo(dtype).tiny)  # 0·log(tiny) = 0, never 0·(-inf)
            rows[0, part] = work.log2_().mul_(chunk).sum(-1).neg_()
            rows[1:4, part] = torch.einsum("cij,ijk->kci", chunk, self.kernels)  # distance, forward, local
            rows[4, part] = chunk.amax(-1)
            rows[5:7, part] = torch.bmm(chunk, columns[part]).permute(2, 0, 1)  # special, punctuation
            rows[7, part] = chunk.diagonal(0, -2, -1)
            rows[8, part] = chunk[..., 0]
        rows[0].mul_(math.log(2))
        return rows

    def _means(self, rows: Tensor, maps: Tensor, map_n: Tensor) -> Tensor:
        """(S, M) in STATS order: the row values' means over each map's own query rows, and the three
        statistics that read other rows (entropy_norm, previous, next) over theirs."""
        width, dtype, positions = maps.shape[-1], maps.dtype, self.positions
        entropy_rows, self_rows = rows[0], rows[7]
        real = positions[None, :] < map_n[:, None]  # (M, T) the text's own query rows
        count = map_n.to(dtype)
        zero = torch.zeros((), dtype=dtype, device=maps.device)

        def means(values: Tensor, keep: Tensor, counts: Tensor) -> Tensor:
            """Means of (K, M, T) row values over the rows in ``keep`` ((K|1, M, T)), ``counts`` of them
            ((K|1, M)); 0 where there are none. Each row's sum is its own: K at once adds the same terms."""
            total = torch.where(keep, values, zero).sum(-1)
            return torch.where(counts > 0, total / counts.clamp(min=1), torch.zeros_like(total))

        # Pointers: row i's weight on key i - 1 (rows 1..n-1) and i + 1 (rows 0..n-2).
        previous_rows = torch.zeros_like(self_rows)
        previous_rows[:, 1:] = maps.diagonal(-1, -2, -1)
        next_rows = torch.zeros_like(self_rows)
        next_rows[:, :-1] = maps.diagonal(1, -2, -1)
        shifted = real & (positions[None, :] >= 1)
        ahead = real & (positions[None, :] + 1 < map_n[:, None])

        if self.causal:  # row i sees i + 1 keys; row 0 cannot spread
            seen = (positions + 1).to(dtype)
            spread, spread_count = shifted, count - 1
        else:
            seen = map_n[:, None].to(dtype).expand(-1, width)
            spread, spread_count = real & (map_n[:, None] > 1), torch.where(map_n > 1, count, 0 * count)
        entropy_ratio = entropy_rows / seen.clamp(min=2).log()

        # Two masked means, not twelve (a few launches on a GPU, not tens): the nine statistics of every
        # real row, in rows' order, and the three of their own rows.
        every = means(rows, real, count)
        own = means(
            torch.stack([entropy_ratio, previous_rows, next_rows]),
            torch.stack([spread, shifted, ahead]),
            torch.stack([spread_count, count - 1, count - 1]),
        )
        names = ("entropy", "distance", "forward", "local", "max", "special", "punctuation", "self", "first")
        by_name = dict(zip(names, every, strict=True))
        by_name |= dict(zip(("entropy_norm", "previous", "next"), own, strict=True))
        return torch.stack([by_name[key] for key in STATS])  # (S, M)


def batch_head_labels(stats: dict[str, Tensor], *, chance: dict[str, Tensor] | None = None) -> Tensor:
    """``head_labels`` of every text at once: the index into ``LABELS`` of each head's label, [B, L, H]
    (int64), by the same rules (the first pointer on ties, then broad, local, mixed; then, given each
    text's ``chance`` {"induction": [B, 1, 1]} and an ``induction`` score [B, L, H], the induction rule)."""
    pointer_scores = torch.stack(
        [stats[key] for key in definitions.POINTER_LABELS.values()], dim=-1
    )  # [B, L, H, P]
    best_score, best_index = pointer_scores.max(dim=-1)  # the first index on ties, as pick_labels
    broad = torch.full_like(best_index, definitions.LABELS.index("broad"))
    local = torch.full_like(best_index, definitions.LABELS.index("local"))
    mixed = torch.full_like(best_index, definitions.LABELS.index("mixed"))
    rest = torch.where(
        stats["entropy_norm"] >= definitions.BROAD_THRESHOLD,
        broad,
        torch.where(stats["local"] >= definitions.LOCAL_THRESHOLD, local, mixed),
    )
    labels = torch.where(best_score > definitions.POINTER_THRESHOLD, best_index, rest)
    if chance is None or "induction" not in stats:
        return labels
    score = stats["induction"]  # NaN (a text with no repeat: absent) fails both comparisons
    induction = (score >= DETECTION_THRESHOLD) & (score - chance["induction"] >= DETECTION_MARGIN)
    return torch.where(induction, definitions.LABELS.index("induction"), labels)
