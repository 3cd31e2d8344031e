"""The compact binary transport of attention tensors ("HSA1", docs/design.md).

One framing for every answer: magic, header length, a JSON header that names the scheme (with its storage
order and its `max_abs_error`), zero padding to 4, then the payload the scheme defines. Two kinds:

Quantized (uint8 with a float32 scale per query row): value = q / 255 * scale, so the absolute error of any
value is at most ``scale / 510 <= 1 / 510``. Payload: scales [L, H, n], then q [L, H, n, n]. With fewer
``bits`` (header ``quantization.bits``, 8 when absent), q takes 2**bits - 1 levels in its byte: value =
q / (2**bits - 1) * scale, within ``scale / (2 * (2**bits - 1))``.
A tensor on an accelerator is quantized there (``quantize_tensor``, the same bytes as ``quantize``), so only
the payload's bytes cross to the host, in one copy through pinned memory.

- ``row-max-uint8`` (the API's default): scale is the row's maximum, so that maximum is exact and a diffuse
  row keeps 255 levels of contrast.
- ``abs-uint8``: scale is 1 for every row (255 absolute levels). The same worst-case error, less contrast
  inside diffuse rows, and about half the bytes on the wire (few distinct small bytes).
- ``abs-uint8-key-major``: abs-uint8 with q stored key-major, [L, H, key, query]. A key's column is often
  nearly constant (every query looks at [CLS] or [SEP] alike), which deflate finds as long runs: 7% fewer
  bytes at 129 tokens and 18% at 512 than abs-uint8 (MiniLM). The page's transport.

Exact: ``float32-shuffled``, the model's values as float32 little-endian [L, H, n, n] query-major, their
bytes grouped by significance (byte 0 of every value, then byte 1, 2, 3: the shuffle filter of HDF5 and
Blosc), ``max_abs_error`` 0. /api/attention/head/compact sends one head this way (layers = heads = 1). The
low mantissa bytes of attention are noise that no compressor shrinks; grouped, the sign-and-exponent bytes
form long runs: ~3.3 bytes a value after gzip against ~3.6 for plain float32 and ~21 for the JSON.

Sections (an encoder-decoder's answer): one buffer holds several tensors [L, H, rows, cols] in the header's
one scheme, listed in the header's ``sections`` ({"kind", "layers", "heads", "rows", "cols"}, in payload
order): each section's payload as above with n x n read as rows x cols (scales [L, H, rows]; q [L, H, rows,
cols], or key-major [L, H, cols, rows]), zero-padded so the next one starts 4-aligned. A buffer without
``sections`` is one square tensor, described by the header's layers, heads and n.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mha.devices import to_host

MAGIC = b"HSA1"
MEDIA_TYPE = "application/vnd.headscope.attention"
# Rounding to the nearest of 255 steps errs by at most half a step of the row's scale (<= 1).
MAX_ABS_ERROR = 1 / 510
BITS = range(2, 9)  # q's levels are 2**bits - 1, stored one per byte
ORDERS = ("query-major", "key-major")


@dataclass(frozen=True)
class _Scheme:
    scale: str | None  # "row-max" or "one" for uint8 q with per-row scales; None: shuffled float32 values
    order: str  # "query-major" ([query][key], rows contiguous) or "key-major" ([key][query])

    def max_abs_error(self, bits: int) -> float:
        return 0.0 if self.scale is None else 1 / (2 * levels(bits))


_SCHEMES = {
    "row-max-uint8": _Scheme("row-max", "query-major"),
    "abs-uint8": _Scheme("one", "query-major"),
    "abs-uint8-key-major": _Scheme("one", "key-major"),
    "float32-shuffled": _Scheme(None, "query-major"),
}
SCHEMES = tuple(_SCHEMES)
QUANTIZED_SCHEMES = tuple(name for name, spec in _SCHEMES.items() if spec.scale is not None)

# Deflate settings (MiniLM, abs-uint8-key-major; 129 tokens = 1.2 MB raw, 257 = 4.8 MB, 512 = 19 MB):
#   Z_FILTERED level 7: 0.229 bytes/value in ~0.13 s at 129 tokens, 0.154 in ~0.4 s at 257;
#   Z_FILTERED level 6: 0.232 in ~0.09 s at 129, 0.157 in ~0.3 s at 257, 0.097 in ~0.9 s at 512;
#   Z_RLE level 6:      0.250 in ~0.015 s at 129,                         0.103 in ~0.17 s at 512;
#   levels 8 and 9 save another 3% for 3 to 6 times the time.
# Filtering also finds the 4-byte period of abs-uint8's constant scales, which run-length matching (distance
# 1 only) cannot. So filtered level 7 up to FILTERED_MAX_BYTES, where the bytes matter most (the page's first
# view has a budget of 0.3 bytes a value, docs/design.md) and it costs a few tenths of a second at most; run-
# length above, where filtering would add ~0.7 s to a 512-token answer for 6% fewer bytes. Each answer is
# compressed once, then served from the cache.
FILTERED_LEVEL = 7
FILTERED_MAX_BYTES = 4 << 20
RLE_LEVEL = 6
GZIP_WBITS = 31  # 16 + 15: a gzip container, which browsers decode for Content-Encoding: gzip


# The page's first view moves at most 0.3 bytes per attention value (docs/design.md). Below ~128 tokens its
# 8-bit heads alone take 0.25-0.36 of that (MiniLM: a short row spreads its weight over fewer keys, so fewer
# zero bytes), and each bit fewer saves ~30 % of them. So "auto" (what the page asks for) takes the most
# bits that keep the whole view under 0.3 with a margin for prose: 8 from 128 tokens, 7 from 88, 6 from 64;
# below 64, 8 again, where the whole view is ~100 KB and precision costs nothing that matters.
AUTO_BITS = ((128, 8), (88, 7), (64, 6), (0, 8))


def auto_bits(n: int) -> int:
    """The bits `bits="auto"` gives an answer of `n` tokens (AUTO_BITS)."""
    return next(bits for least, bits in AUTO_BITS if n >= least)


def levels(bits: int) -> int:
    """The largest q of `bits` bits: values quantize to q / levels * scale."""
    if type(bits) is not int or bits not in BITS:  # 8.0 and True would pass `in`
        raise ValueError(f"bits must be one of {BITS.start}..{BITS.stop - 1}, got {bits!r}")
    return (1 << bits) - 1


def _spec(scheme: str) -> _Scheme:
    try:
        return _SCHEMES[scheme]
    except KeyError:
        raise ValueError(f"scheme {scheme!r} is not one of {SCHEMES}") from None


def _checked(attentions: torch.Tensor, *, square: bool = True) -> torch.Tensor:
    if attentions.ndim != 4 or (square and attentions.shape[-1] != attentions.shape[-2]):
        want = "[L, H, n, n]" if square else "[L, H, rows, cols]"
        raise ValueError(f"attentions must have shape {want}, got {tuple(attentions.shape)}")
    return attentions.detach()


def _as_array(attentions: torch.Tensor, *, square: bool = True) -> np.ndarray:
    return _checked(attentions, square=square).to(device="cpu", dtype=torch.float32).numpy()


def _quantized_spec(scheme: str, bits: int) -> tuple[_Scheme, int]:
    spec = _spec(scheme)
    top = levels(bits)
    if spec.scale is None:
        raise ValueError(f"scheme {scheme!r} is not quantized; one of {QUANTIZED_SCHEMES} is")
    return spec, top


def quantize(
    attentions: torch.Tensor, *, scheme: str = "row-max-uint8", square: bool = True, bits: int = 8
) -> tuple[np.ndarray, np.ndarray]:
    """[L, H, rows, cols] float attention -> (scales float32 [L, H, rows], q uint8 [L, H, rows, cols]
    query-major, 0..2**bits - 1) on the host, in numpy; rows = cols unless `square` is False."""
    spec, top = _quantized_spec(scheme, bits)
    a = _as_array(attentions, square=square)
    if spec.scale == "row-max":
        scales = a.max(axis=-1)  # [L, H, rows]
    else:
        # Attention lies in [0, 1]: a scale of 1 keeps the same bound with fewer distinct bytes.
        scales = np.ones(a.shape[:-1], dtype=np.float32)
    # A zero row (never from softmax, but possible from a caller) quantizes to zeros, not NaN.
    safe = np.where(scales > 0, scales, 1.0).astype(np.float32)
    q = np.rint(a * (top / safe)[..., None])
    with np.errstate(invalid="ignore"):  # a NaN (half-precision overflow) casts to 0, on x86 and ARM alike
        q = np.clip(q, 0, top).astype(np.uint8)
    return scales.astype("<f4", copy=False), q


def quantize_tensor(
    attentions: torch.Tensor, *, scheme: str = "row-max-uint8", square: bool = True, bits: int = 8
) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize` in torch, on the tensor's own device (the model's: only the bytes need to leave it):
    (scales float32 [L, H, rows], q uint8 [L, H, rows, cols] query-major), the same bytes as `quantize`."""
    spec, top = _quantized_spec(scheme, bits)
    a = _checked(attentions, square=square).to(torch.float32)
    if spec.scale == "row-max":
        scales = a.amax(dim=-1)  # [L, H, rows]; NaN in a row gives NaN, as numpy's max
    else:
        scales = torch.ones(a.shape[:-1], dtype=torch.float32, device=a.device)
    safe = torch.where(scales > 0, scales, 1.0)
    # top / safe as one correctly rounded float32 division, as numpy's: `int / tensor` would be
    # reciprocal(safe) * top in torch (Tensor.__rtruediv__), two roundings, another byte now and then.
    factor = torch.full_like(safe, top).div_(safe)
    # round is half to even, as np.rint; clamp keeps a NaN, which nan_to_num makes the 0 numpy's cast gives.
    q = torch.mul(a, factor.unsqueeze(-1)).round_().clamp_(0, top).nan_to_num_(0.0)
    return scales, q.to(torch.uint8)


def _payload(attentions: torch.Tensor, spec: _Scheme, scheme: str, *, square: bool, bits: int) -> list[bytes]:
    """One tensor's payload in `scheme`. A quantized one on the CPU in numpy: quantize_tensor there took
    1.4-2.3x its time at 512 tokens (MiniLM, 1 and 2 threads, best of 7-15 interleaved)."""
    if spec.scale is None:
        values = _as_array(attentions, square=square).astype("<f4", copy=False).reshape(-1)
        return [values.view(np.uint8).reshape(-1, 4).T.tobytes()]  # 4 planes: byte k of every value
    if attentions.device.type != "cpu":
        return [_device_payload(attentions, spec, scheme, square=square, bits=bits)]
    scales, q = quantize(attentions, scheme=scheme, square=square, bits=bits)
    if spec.order == "key-major":
        q = np.ascontiguousarray(q.swapaxes(-1, -2))  # [L, H, key, query]
    return [scales.tobytes(), q.tobytes()]


def _device_payload(
    attentions: torch.Tensor, spec: _Scheme, scheme: str, *, square: bool, bits: int
) -> bytes:
    """A quantized payload built where the tensor is (quantize_tensor, and key-major's transpose there too):
    only its bytes come to the host, in one copy through pinned memory. Runs on any device."""
    scales, q = quantize_tensor(attentions, scheme=scheme, square=square, bits=bits)
    if spec.order == "key-major":
        q = q.transpose(-1, -2)  # [L, H, key, query]
    # The payload is the scales' bytes then q's: packed on the device so that one transfer carries both.
    # Float32 little-endian on the wire: the device's own order (every CUDA host's, and x86's, ARM's).
    packed = torch.cat([scales.reshape(-1).view(torch.uint8), q.reshape(-1)])
    return bytes(to_host(packed).ready().numpy().data)


def _framed(header: dict[str, Any], spec: _Scheme, scheme: str, payload: list[bytes], bits: int) -> bytes:
    quantization: dict[str, Any] = {"scheme": scheme, "order": spec.order}
    if spec.scale is not None:
        quantization["bits"] = bits
    quantization["max_abs_error"] = spec.max_abs_error(bits)
    head = json.dumps({**header, "quantization": quantization}, ensure_ascii=False).encode("utf-8")
    prefix_len = 8 + len(head)
    pad = -prefix_len % 4  # so the float32 payload starts 4-aligned and a Float32Array can view it
    return b"".join([MAGIC, struct.pack("<I", len(head)), head, b"\0" * pad, *payload])


def encode(
    header: dict[str, Any], attentions: torch.Tensor, *, scheme: str = "row-max-uint8", bits: int = 8
) -> bytes:
    """The HSA1 buffer: magic, header length, JSON header, zero padding to 4, the scheme's payload (a
    quantized scheme's q in `bits` bits)."""
    spec = _spec(scheme)
    return _framed(header, spec, scheme, _payload(attentions, spec, scheme, square=True, bits=bits), bits)


def encode_sections(
    header: dict[str, Any],
    sections: Sequence[tuple[str, torch.Tensor]],
    *,
    scheme: str = "row-max-uint8",
    bits: int = 8,
) -> bytes:
    """An HSA1 buffer of several tensors [L, H, rows, cols] (kind, tensor), in order, each 4-aligned; the
    header gains their `sections` list."""
    spec = _spec(scheme)
    described: list[dict[str, Any]] = []
    payload: list[bytes] = []
    for kind, attentions in sections:
        layers, heads, rows, cols = _as_array(attentions, square=False).shape
        described.append({"kind": kind, "layers": layers, "heads": heads, "rows": rows, "cols": cols})
        # The payload starts 4-aligned, so padding its length to 4 aligns the next section.
        payload.append(b"\0" * (-sum(map(len, payload)) % 4))
        payload.extend(_payload(attentions, spec, scheme, square=False, bits=bits))
    return _framed({**header, "sections": described}, spec, scheme, payload, bits)


def compress(data: bytes) -> bytes:
    small = len(data) <= FILTERED_MAX_BYTES
    level, strategy = (FILTERED_LEVEL, zlib.Z_FILTERED) if small else (RLE_LEVEL, zlib.Z_RLE)
    # zlib writes mtime 0 in the gzip header: identical answers give identical bytes (cacheable, comparable).
    deflate = zlib.compressobj(level, zlib.DEFLATED, GZIP_WBITS, 9, strategy)
    return deflate.compress(data) + deflate.flush()


def compress_json(data: bytes, *, level: int = 1) -> bytes:
    """gzip for JSON text: the default strategy (RLE suits HSA1's byte planes, not digits). Level 1 makes
    6-decimal arrays ~4x smaller at ~100 MB/s, so a 512 x 512 window costs milliseconds, not a stall; a
    small answer of every first view (the head statistics, ~17 KB) takes level 6: 10% fewer bytes than
    level 1 in under a millisecond (level 9 saves another 0.2% for ten times the time)."""
    deflate = zlib.compressobj(level, zlib.DEFLATED, GZIP_WBITS)
    return deflate.compress(data) + deflate.flush()


def decode(buffer: bytes) -> tuple[dict[str, Any], np.ndarray]:
    """Inverse of `encode` (for tests and Python clients): (header, float32 [L, H, n, n] query-major). For a
    buffer with sections, the first one's values (an encoder-decoder's encoder); `decode_sections` has all."""
    header, sections = decode_sections(buffer)
    return header, next(iter(sections.values()))


def decode_sections(buffer: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, {kind: float32 [L, H, rows, cols] query-major}) in payload order; a buffer without
    sections gives one, "self", of the header's [layers, heads, n, n]."""
    if buffer[:4] != MAGIC:
        raise ValueError(f"not an HSA1 buffer: starts with {buffer[:4]!r}")
    (h,) = struct.unpack_from("<I", buffer, 4)
    header = json.loads(buffer[8 : 8 + h].decode("utf-8"))
    offset = 8 + h + (-(8 + h) % 4)
    spec = _spec(header["quantization"]["scheme"])
    top = levels(header["quantization"].get("bits", 8))
    listed = header.get("sections")
    if listed is None:
        n = header["n"]
        listed = [
            {"kind": "self", "layers": header["layers"], "heads": header["heads"], "rows": n, "cols": n}
        ]
    values = {}
    for section in listed:
        offset += -offset % 4  # each section starts 4-aligned
        shape = (section["layers"], section["heads"], section["rows"], section["cols"])
        values[section["kind"]], offset = _decoded(buffer, offset, shape, spec, top)
    if offset != len(buffer):
        raise ValueError(f"HSA1 buffer has {len(buffer)} bytes, expected {offset}")
    return header, values


def _decoded(
    buffer: bytes, offset: int, shape: tuple[int, int, int, int], spec: _Scheme, top: int
) -> tuple[np.ndarray, int]:
    """One section's float32 values at `offset`, and the offset after them (np.frombuffer raises
    ValueError for a buffer that ends before)."""
    L, H, rows, cols = shape
    count = L * H * rows * cols
    if spec.scale is None:
        planes = np.frombuffer(buffer, dtype=np.uint8, count=4 * count, offset=offset)
        values = planes.reshape(4, -1).T.copy().view("<f4")
        end = offset + 4 * count
    else:
        scales = np.frombuffer(buffer, dtype="<f4", count=L * H * rows, offset=offset).reshape(L, H, rows)
        q = np.frombuffer(buffer, dtype=np.uint8, count=count, offset=offset + 4 * L * H * rows)
        if spec.order == "key-major":
            q = q.reshape(L, H, cols, rows).swapaxes(-1, -2)
        values = q.reshape(L, H, rows, cols).astype(np.float32) / float(top) * scales[..., None]
        end = offset + 4 * L * H * rows + count
    return values.reshape(shape).astype(np.float32, copy=False), end


def accepts_gzip(accept_encoding: str | None) -> bool:
    """True when an Accept-Encoding header allows gzip (RFC 9110: a q of 0 refuses it)."""
    if not accept_encoding:
        return False
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() not in ("gzip", "*"):
            continue
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        return q > 0
    return False
