"""The compact transport quantized where the tensor is (issue 27 item 4): `quantize_tensor` (torch, any
device) gives the bytes of the numpy path byte for byte, on every scheme, bit width and section shape, and
a CUDA tensor's answer equals its CPU copy's (that part where CUDA exists)."""

from __future__ import annotations

import gzip
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch

from app import compact
from app.main import create_app
from app.service import bodies, cache_key
from app.service.computed import from_result
from tests.app.started import serving

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def reference_quantize(a: np.ndarray, *, row_max: bool, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The numpy quantizer as it was before the torch one (np.clip; a NaN's cast to uint8 is 0 on every
    machine the project runs on): what both must still give."""
    top = (1 << bits) - 1
    scales = a.max(axis=-1) if row_max else np.ones(a.shape[:-1], dtype=np.float32)
    safe = np.where(scales > 0, scales, 1.0).astype(np.float32)
    with np.errstate(invalid="ignore"):
        q = np.clip(np.rint(a * (top / safe)[..., None]), 0, top).astype(np.uint8)
    return scales.astype("<f4"), q


def softmax_rows(
    shape: tuple[int, ...], seed: int, *, causal: bool = False, sharp: float = 4.0
) -> torch.Tensor:
    scores = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * sharp
    if causal:  # zeros above the diagonal, as a decoder's rows
        rows, cols = shape[-2:]
        scores = scores.masked_fill(torch.ones(rows, cols, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


def awkward(bits: int) -> torch.Tensor:
    """[2, 2, 6, 6] rows that test the rounding's edges: exact half steps (round half to even), a zero row,
    a NaN cell, a one-hot row, a uniform row, and values just either side of a half step."""
    top = (1 << bits) - 1
    a = softmax_rows((2, 2, 6, 6), 9)
    # Its maximum is 1, so the scale is 1 in either scheme and q's are (nearly) k + 0.5.
    a[0, 0, 0] = torch.tensor([0.5, 1.5, 2.5, 3.5, 4.5, top], dtype=torch.float32) / top
    a[0, 0, 1] = 0.0
    a[0, 1, 2, 3] = float("nan")
    a[1, 0, 3] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    a[1, 1, 4] = 1 / 6
    half = torch.tensor(0.5 / top, dtype=torch.float32)
    a[1, 1, 5] = torch.stack([half.nextafter(torch.tensor(0.0)), half, half.nextafter(torch.tensor(1.0))] * 2)
    a[1, 1, 5, 5] = 1.0
    return a


CASES = {
    "square": softmax_rows((2, 3, 7, 7), 1),
    "causal": softmax_rows((3, 2, 9, 9), 2, causal=True),
    "flat": softmax_rows((1, 4, 16, 16), 3, sharp=0.1),  # diffuse rows: many distinct small bytes
    "cross": softmax_rows((2, 2, 5, 11), 4),  # an encoder-decoder's rows x cols section
    "one token": softmax_rows((2, 2, 1, 1), 5),
}


@pytest.mark.parametrize("bits", list(compact.BITS))
@pytest.mark.parametrize("scheme", compact.QUANTIZED_SCHEMES)
@pytest.mark.parametrize("case", [*CASES, "awkward"])
def test_quantize_tensor_gives_the_numpy_bytes(case: str, scheme: str, bits: int) -> None:
    a = awkward(bits) if case == "awkward" else CASES[case]
    square = a.shape[-1] == a.shape[-2]
    want_scales, want_q = reference_quantize(a.numpy(), row_max=scheme == "row-max-uint8", bits=bits)
    scales, q = compact.quantize(a, scheme=scheme, square=square, bits=bits)
    t_scales, t_q = compact.quantize_tensor(a, scheme=scheme, square=square, bits=bits)
    assert t_scales.dtype == torch.float32 and t_q.dtype == torch.uint8
    for got_scales, got_q in ((scales, q), (t_scales.numpy(), t_q.numpy())):
        assert got_scales.tobytes() == want_scales.tobytes()  # bytes: NaN scales compare equal too
        assert got_q.tobytes() == want_q.tobytes()
    # The device path's whole payload (the scales and q packed, key-major transposed there) on the CPU.
    spec = compact._spec(scheme)
    host = b"".join(compact._payload(a, spec, scheme, square=square, bits=bits))
    assert compact._device_payload(a, spec, scheme, square=square, bits=bits) == host


def test_quantize_tensor_refuses_what_quantize_refuses() -> None:
    a = CASES["square"]
    with pytest.raises(ValueError, match="is not quantized"):
        compact.quantize_tensor(a, scheme="float32-shuffled")
    with pytest.raises(ValueError, match="bits must be one of 2..8"):
        compact.quantize_tensor(a, bits=9)
    with pytest.raises(ValueError, match=r"must have shape \[L, H, n, n\]"):
        compact.quantize_tensor(CASES["cross"])


def test_a_float16_tensor_quantizes_as_its_float32_values() -> None:
    """A half-precision model's maps (float16 on a GPU) give the bytes of their float32 values."""
    a = CASES["causal"].half()
    spec = compact._spec("abs-uint8-key-major")
    want = b"".join(compact._payload(a.float(), spec, "abs-uint8-key-major", square=True, bits=7))
    assert compact._device_payload(a, spec, "abs-uint8-key-major", square=True, bits=7) == want


@CUDA
@pytest.mark.parametrize("bits", [8, 6, 2])
@pytest.mark.parametrize("scheme", compact.QUANTIZED_SCHEMES)
def test_a_cuda_tensor_encodes_to_the_bytes_of_its_cpu_copy(scheme: str, bits: int) -> None:
    header = {"n": 9, "layers": 3, "heads": 2}
    a = CASES["causal"]
    assert compact.encode(header, a.cuda(), scheme=scheme, bits=bits) == compact.encode(
        header, a, scheme=scheme, bits=bits
    )
    sections = [("encoder", CASES["square"]), ("cross", CASES["cross"])]
    on_device = [(kind, t.cuda()) for kind, t in sections]
    assert compact.encode_sections(header, on_device, scheme=scheme, bits=bits) == compact.encode_sections(
        header, sections, scheme=scheme, bits=bits
    )
    spec = compact._spec(scheme)
    weird = awkward(bits)
    assert compact._device_payload(weird.cuda(), spec, scheme, square=True, bits=bits) == b"".join(
        compact._payload(weird, spec, scheme, square=True, bits=bits)
    )


def test_a_cpu_views_host_attentions_are_its_maps(minilm) -> None:  # type: ignore[no-untyped-def]
    """On the CPU nothing is copied: `attentions` is `maps`, and a head is a view of it."""
    view = from_result("m", minilm.info, minilm.attend("The cat sat on the mat.", hidden_state=False))
    assert view.attentions is view.maps
    assert view.head(1, 2).data_ptr() == view.maps[1, 2].data_ptr()


FIRST_VIEW = "/api/attention/compact?scheme=abs-uint8-key-major&bits=auto"


@CUDA
def test_a_cuda_service_builds_its_first_view_on_the_device(make_settings) -> None:  # type: ignore[no-untyped-def]
    """The compact answer and the exact head of a CUDA model's forward: the maps stay on the device, the
    answer is the bytes of the same maps quantized on the host, the head the model's own float32; only
    an answer that needs every float32 value on the host (the statistics) copies them over."""
    text = "The cat sat on the mat because it was tired."
    with serving(create_app(make_settings(device="cuda"))) as client:
        service = client.app.state.service
        answer = client.post(FIRST_VIEW, json={"text": text})
        assert answer.status_code == 200, answer.text[:300]
        source = (service.models.registry.default, text, None, None, False, None, None)
        view = service.answers.cache.get(cache_key("result", source))
        assert view.maps.device.type == "cuda" and "_host" not in view.__dict__
        on_host = replace(view, maps=view.maps.cpu())
        want = bodies.encode_compact(on_host, threading.Event(), scheme="abs-uint8-key-major", bits="auto")
        assert answer.content == gzip.decompress(want)
        head = client.post("/api/attention/head/compact", json={"text": text, "layer": 1, "head": 2})
        assert head.status_code == 200 and "_host" not in view.__dict__
        assert np.array_equal(compact.decode(head.content)[1][0, 0], on_host.maps[1, 2].numpy())
        assert client.post("/api/analysis", json={"text": text}).status_code == 200
        assert torch.equal(view.__dict__["_host"], on_host.maps)
