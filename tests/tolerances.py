"""Every numeric tolerance the suite uses, each derived from the arithmetic it covers.

Float32 results depend on the order of each sum, and that order depends on the CPU's GEMM kernel (AVX2 or
AVX-512, AMD or Intel), the batch shape and the padding. So two float32 computations of the same thing are
compared with a bound that follows from float32 rounding, never with one fitted to the noise of one machine.
What the tests are for, a swapped answer, a wrong mask or a wrong weight, moves attention by ~1e-1.

u is float32's unit roundoff, 2**-24 ≈ 6.0e-8 (half of torch.finfo(torch.float32).eps).
"""

from __future__ import annotations

U32 = 2.0**-24  # float32 unit roundoff: one rounding moves a value in [0, 1] by at most this

# JSON answers round to 6 decimals: half a unit in the last place, plus float64's own rounding of the
# decimal (1e-16 at most).
ROUND6 = 5e-7 + 1e-15

# Two float32 forward passes of the same network that differ only in summation order (another CPU kernel,
# another batch shape or padding, transformers' eager code against ours). Each logit is a chain of dot
# products over k <= 1,536 terms (MiniLM's feed-forward width); reordering one such sum moves it by about
# sqrt(k)·u relative (Higham & Mary's probabilistic bound; k·u = 9e-5 is the never-reached worst case), so
# a few layers move a logit of size ~10 by ~1e-5 at the very most and a softmax weight (slope <= 1/2) by
# less. 1e-5 is that bound and still four orders of magnitude below a wrong answer.
FORWARD = 1e-5

# The same forward, rounded to 6 decimals on one side (the service's JSON against mha directly).
FORWARD_JSON = FORWARD + ROUND6


def float32_sum(terms: int, magnitude: float = 1.0) -> float:
    """A float32 sum of `terms` values whose absolute values add up to at most `magnitude`, against the same
    sum in another order or in float64: each addition rounds by at most u of the running total (Higham's
    gamma_k), so terms·u·magnitude at worst."""
    return terms * U32 * magnitude


def row_sum(n: int) -> float:
    """|sum of a float32 softmax row - 1| over n keys: each weight carries one division's rounding (u) and
    the n-term sum adds float32_sum(n) at worst, so 2·n·u."""
    return n * U32 + float32_sum(n)


def rounded_row_sum(n: int) -> float:
    """The same for a row of 6-decimal values: each carries up to ROUND6, so n·ROUND6 on top."""
    return row_sum(n) + n * ROUND6


# -- the compact transport (app/compact.py, docs/design.md) -----------------------------------------------

# Its quantized schemes round a / scale * levels (levels = 2**bits - 1, 255 at 8 bits) to the nearest
# integer, scale <= 1: half a step, 1/levels / 2. Every header states it as max_abs_error.
QUANT8 = 1 / 510


def quant(bits: int, *, heads: int = 1) -> float:
    """|decoded - model| for a `bits`-bit value as the page decodes it (or the mean of `heads` of them):
    half a step; 2u from the encoder's float32 a·(levels/scale) (two roundings move the rounding point by
    2u·levels steps, so 2u·scale <= 2u in value); and the decoder's float32 store, one rounding per head
    summed (u each, <= 1)."""
    return 1 / (2 * ((1 << bits) - 1)) + 2 * U32 + heads * U32


def quant8(*, heads: int = 1) -> float:
    """quant(8): the 8-bit bound, QUANT8 plus the float32 roundings."""
    return quant(8, heads=heads)


def regemm_weight(dim: int, max_score: float) -> float:
    """|w - w'| between two reads of one trace's weight exp(s - lse) whose scores come from GEMMs of other
    shapes (a window's block of rows against a single row): each dim-term dot product reorders by up to
    dim·u·max_score (Higham's gamma_dim), the weight moves by w (<= 1) times that, plus one rounding of exp
    on each side."""
    return 2 * dim * U32 * max_score + 2 * U32


def recomputed_weight(dim: int, max_score: float) -> float:
    """|w - w'| between a weight recomputed as exp(s - lse) (mha.trace.blocked) and the softmax of another
    forward: each score is a dim-term dot product, moved by up to dim·u·max_score in another GEMM kernel
    (Higham's gamma_dim; |s| <= scale·|q|·|k| by Cauchy-Schwarz gives max_score), and w = exp(s - lse) moves
    by w·(Δs + Δlse) <= 2·dim·u·max_score; on top, the FORWARD reordering of the layers below."""
    return FORWARD + 2 * dim * U32 * max_score


# torch's CPU flash kernel exponentiates with Vectorized::exp_u20, "a faster version of exp with ULP=20"
# (ATen/cpu/vec/vec256/vec256_float.h): within 20 float32 ulps of exp, 2u each.
EXP_U20 = 40 * U32
# The CPU flash kernel's key blocks (mha.trace.memory.FLASH_KV_SPLIT): a running sum is rescaled once a block.
FLASH_KV_BLOCK = 512


def fused_lse(n: int, dim: int, max_score: float) -> float:
    """|lse - a float64 logsumexp of the same float32 q and k| for a fused kernel's lse of a row over n keys.
    Each score is a dim-term float32 dot product, moved by up to dim·u·max_score (Higham's gamma_dim; |s| <=
    max_score by Cauchy-Schwarz), which moves lse by as much, and its difference from the row's running
    max rounds by u·2·max_score. The sum of n exps, each within EXP_U20 and rescaled once per later key
    block (another EXP_U20 each), adds n float32 terms (float32_sum): relative error n·u + blocks·EXP_U20,
    which the log turns into as much absolute. The log and the final max + log add round once each:
    u·|lse| <= u·(max_score + ln n) each."""
    import math

    blocks = -(-n // FLASH_KV_BLOCK)
    score = dim * U32 * max_score + 2 * U32 * max_score
    return score + float32_sum(n) + blocks * EXP_U20 + 2 * U32 * (max_score + math.log(n))


# -- corpus runs (mha.analysis.batched) --------------------------------------------------------------------


def batched_stat(stat: str, width: int) -> float:
    """|batched - alone| for one head_stats statistic of a text in a batch padded to ``width`` tokens. Both
    compute the same terms; the padded row sums ``width`` terms (zeros included) where the text alone sums
    n, and the mean is a masked sum over ``width`` rows: each sum reordered moves it by at most width·u·R
    (float32_sum), R the largest row value (1 for a weight, width - 1 tokens for distance, ln(width) nats
    for entropy, log2(width) for entropy_norm, which divides entropy by ln k >= ln 2). Row sum and mean on
    both sides, plus a vectorized log2 that may differ from the scalar one by an ulp a term (another
    width·u·R): 6·width·u·R, and u for the division."""
    import math

    largest = {"distance": width - 1.0, "entropy": math.log(width), "entropy_norm": math.log2(width)}
    return 6 * float32_sum(width, max(largest.get(stat, 1.0), 1.0)) + U32


def norm_share_stat(stat: str, width: int) -> float:
    """The same for a statistic of weight × value norm shares (the corpus's --weighting norm): batched_stat,
    plus what the shares move. A share a·n / Σ a·n carries a product's and a division's rounding (2u) and
    its row total's sum over ``width`` keys in another order (float32_sum(width), relative); each norm, the
    root of a sum of squares of value coordinates from another GEMM shape, moves by FORWARD relative at
    most (FORWARD's argument), twice in a share (its own and its row total's). A relative change δ of every
    share moves a statistic whose row values lie within R by δ·R, and the entropy's -Σ s ln s by at most
    δ·Σ s |ln s + 1| <= δ·(ln width + 1), over ln 2 for entropy_norm: δ·(R + 2) covers both."""
    import math

    largest = {"distance": width - 1.0, "entropy": math.log(width), "entropy_norm": math.log2(width)}
    delta = 2 * FORWARD + float32_sum(width) + 2 * U32
    return batched_stat(stat, width) + delta * (max(largest.get(stat, 1.0), 1.0) + 2)
