"""attend_batch from a device (issue 27 item 4): to_host_packed packs parts of any strides and dtypes side by
side and copies them once; from CUDA a batch's results are views of that one (pinned) buffer, equal to the
CPU's, with no wait for the device before it; on_device=True leaves them on the device, each its own. The
CPU's results are unchanged (tests/mha/test_pretrained_api.py checks that they own their storage); what
only a GPU can show runs where CUDA exists."""

from __future__ import annotations

import pytest
import torch
from tolerances import FORWARD, float32_sum

from mha import load_pretrained, random_model
from mha._transfer import HostCopy, rows_to_host, to_host_packed

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# Three lengths and a pair: padded rows and keys, and a segment embedding, in one batch.
ITEMS: list[tuple[str, str | None] | str] = [
    "The cat sat on the mat because it was tired.",
    "Hi.",
    ("Where is the station?", "Two streets down, on the left."),
]


def parts_of(base: torch.Tensor) -> list[torch.Tensor]:
    """Views of every kind attend_batch packs: a padded row's slice, another dtype, an empty one, a
    transposed one (the values are small integers, exact in float16)."""
    return [base[:, 1, :4, :4], base[0].half(), base.new_zeros(0, 3), base[1, 2].t()]


def test_packed_parts_come_back_equal_contiguous_and_apart() -> None:
    parts = parts_of(torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).reshape(2, 3, 5, 5))
    host = to_host_packed(parts).ready()
    for got, part in zip(host, parts, strict=True):
        assert got.dtype == torch.float32 and got.is_contiguous() and got.shape == part.shape
        assert torch.equal(got, part.float())
    assert len({t.untyped_storage().data_ptr() for t in host}) == 1  # one buffer, one copy
    kept = [t.clone() for t in host]
    host[0].fill_(-1.0)  # disjoint: writing one leaves the others alone
    for got, want in zip(host[1:], kept[1:], strict=True):
        assert torch.equal(got, want)


def test_on_device_on_the_cpu_gives_the_same_results() -> None:
    model = random_model(layers=2, heads=2, embed_dim=16)
    plain = model.attend_batch(ITEMS, norms=True)
    kept = model.attend_batch(ITEMS, norms=True, on_device=True)
    for a, b in zip(plain, kept, strict=True):
        assert a.tokens == b.tokens
        for x, y in ((a.attentions, b.attentions), (a.hidden_state, b.hidden_state)):
            assert torch.equal(x, y) and y.untyped_storage().nbytes() == y.numel() * y.element_size()
        assert torch.equal(a.value_products, b.value_products)


@CUDA
def test_a_packed_copy_from_cuda_is_queued_and_pinned() -> None:
    parts = [p.cuda() for p in parts_of(torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).reshape(2, 3, 5, 5))]
    torch.cuda.set_sync_debug_mode("error")  # any wait for the device raises
    try:
        queued = to_host_packed(parts)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert queued.buffer.tensor.is_pinned() and queued.buffer.event is not None
    for got, part in zip(queued.ready(), parts, strict=True):
        assert torch.equal(got, part.float().cpu())


@pytest.fixture(scope="module")
def on_both() -> tuple[object, object]:
    return load_pretrained(device="cpu"), load_pretrained(device="cuda")


@CUDA
def test_a_cuda_batch_waits_once_and_equals_the_cpus(
    on_both: tuple[object, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu, gpu = on_both
    waits = []
    ready = HostCopy.ready

    def the_one_wait(copy: HostCopy) -> torch.Tensor:
        torch.cuda.set_sync_debug_mode("default")  # the wait for the one copy: allowed, and counted
        waits.append(copy.tensor.is_pinned())
        return ready(copy)

    monkeypatch.setattr(HostCopy, "ready", the_one_wait)
    torch.cuda.set_sync_debug_mode("error")  # before it: the forward, the packing, the copy, all queued
    try:
        got = gpu.attend_batch(ITEMS, norms=True)  # type: ignore[attr-defined]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert waits == [True]
    want = cpu.attend_batch(ITEMS, norms=True)  # type: ignore[attr-defined]
    assert len({r.attentions.untyped_storage().data_ptr() for r in got}) == 1  # one buffer for the batch
    for g, w in zip(got, want, strict=True):
        assert g.tokens == w.tokens and g.attentions.device.type == "cpu" and g.attentions.is_contiguous()
        # Another device's kernels sum in another order: FORWARD bounds that (tests/tolerances.py).
        torch.testing.assert_close(g.attentions, w.attentions, atol=FORWARD, rtol=0)
        # The hidden state comes out of the same chain of sums at its own size: FORWARD relative to it.
        scale = float(w.hidden_state.abs().max())
        torch.testing.assert_close(g.hidden_state, w.hidden_state, atol=FORWARD * scale, rtol=0)
        # A product multiplies two values that carry FORWARD each (relative), and sums its E = 384 terms.
        scale = float(w.value_products.abs().max())
        bound = 2 * FORWARD * scale + float32_sum(384, scale)
        torch.testing.assert_close(g.value_products, w.value_products, atol=bound, rtol=0)


@CUDA
def test_on_device_results_stay_on_the_device_each_its_own(on_both: tuple[object, object]) -> None:
    _, gpu = on_both
    host = gpu.attend_batch(ITEMS, hidden_state=False)  # type: ignore[attr-defined]
    kept = gpu.attend_batch(ITEMS, hidden_state=False, on_device=True)  # type: ignore[attr-defined]
    assert len({r.attentions.untyped_storage().data_ptr() for r in kept}) == len(kept)
    for h, k in zip(host, kept, strict=True):
        assert k.attentions.device.type == "cuda" and k.hidden_state is None
        assert k.attentions.untyped_storage().nbytes() == k.attentions.numel() * 4  # owns its storage
        # Two forwards of the same batch on one device: the same kernels, within FORWARD at most.
        torch.testing.assert_close(k.attentions.cpu(), h.attentions, atol=FORWARD, rtol=0)


def test_rows_go_to_the_host_in_their_order_with_their_gaps() -> None:
    """rows_to_host (a CUDA batch's per-text maps, hidden states and value products): each row's tensors come
    back equal, as float32, in their places, None where a row has none (exact: a copy, a float16 to
    float32 cast is exact)."""
    torch.manual_seed(0)
    rows = [
        (torch.randn(2, 3, 3), None, torch.randn(4).half()),
        (torch.randn(2, 5, 5)[:, 1:, 1:], torch.randn(4, 8), None),  # a strided view
    ]
    moved = rows_to_host(rows)
    assert [tuple(t is None for t in row) for row in moved] == [(False, True, False), (False, False, True)]
    for row, back in zip(rows, moved, strict=True):
        for t, b in zip(row, back, strict=True):
            if t is not None:
                assert b is not None and b.dtype == torch.float32 and torch.equal(b, t.float())
