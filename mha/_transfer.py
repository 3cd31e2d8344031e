"""Copies between the host and an accelerator that never wait for the accelerator.

A plain ``tensor.to("cuda")`` from ordinary (pageable) host memory, or ``.to("cpu")`` of a CUDA tensor,
waits until every kernel queued before it has run: one such copy per layer or per forward drains the
queue, and the card idles while the host launches the next kernels. Through pinned host memory with
``non_blocking`` the copy is queued like a kernel instead, and the host goes on; ``HostCopy.ready()`` waits
only when the values are read. On the CPU (and on devices other than CUDA) both are plain copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import torch

__all__ = [
    "PINNED_MAX_BYTES",
    "HostCopy",
    "HostParts",
    "rows_to_host",
    "to_device",
    "to_host",
    "to_host_packed",
]

# Above this a packed copy goes to pageable memory: torch's pinned cache rounds a block up to a power of two
# and keeps it pinned for the life of the process, which for maps of gigabytes costs more than the faster
# copy saves (a 32 x 128-token MiniLM batch is 151 MB; one 2,048-token SmolLM2 attend 4.5 GB).
PINNED_MAX_BYTES = 512 << 20


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; a host tensor goes to CUDA through pinned memory, queued, not waited for
    (the pinned block is held until the copy has run: torch's caching host allocator records it)."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class HostCopy:
    """A tensor on its way to the host: ``ready()`` waits for the copy (CUDA) and returns it."""

    tensor: torch.Tensor  # on the host; its values are valid only once ready() returns
    event: torch.cuda.Event | None = None  # recorded after the copy on its stream (CUDA only)

    def ready(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.tensor


def to_host(tensor: torch.Tensor) -> HostCopy:
    """``tensor`` copied to the host: from CUDA into pinned memory, queued behind the kernels that compute
    it, so the host can launch more work before it reads the values (``HostCopy.ready``)."""
    if tensor.device.type == "cpu":
        return HostCopy(tensor)
    if tensor.device.type != "cuda":
        return HostCopy(tensor.to("cpu"))
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    return HostCopy(host, event)


@dataclass(frozen=True)
class HostParts:
    """Tensors on their way to the host in one buffer: ``ready()`` waits for its copy once and returns
    them, each a contiguous view of that buffer."""

    buffer: HostCopy
    shapes: tuple[torch.Size, ...]

    def ready(self) -> list[torch.Tensor]:
        flat = self.buffer.ready()
        parts: list[torch.Tensor] = []
        start = 0
        for shape in self.shapes:
            size = shape.numel()
            parts.append(flat[start : start + size].view(shape))
            start += size
        return parts


def to_host_packed(parts: Sequence[torch.Tensor], dtype: torch.dtype = torch.float32) -> HostParts:
    """``parts`` (on one device, any strides and dtypes) as contiguous ``dtype`` tensors on the host, in one
    copy: packed side by side on the device (one copy kernel each, the cast included), the packed buffer
    copied once, queued (CUDA, up to PINNED_MAX_BYTES: into pinned memory; else pageable), and waited for
    once (``HostParts.ready``) instead of once a part. The host tensors are disjoint views of one buffer:
    writing to one leaves the others alone, and the buffer lives as long as any of them does."""
    shapes = tuple(part.shape for part in parts)
    device = parts[0].device if parts else torch.device("cpu")
    flat = torch.empty(sum(shape.numel() for shape in shapes), dtype=dtype, device=device)
    start = 0
    for part in parts:
        size = part.numel()
        flat[start : start + size].view(part.shape).copy_(part)
        start += size
    pinned = device.type == "cuda" and flat.numel() * flat.element_size() <= PINNED_MAX_BYTES
    return HostParts(to_host(flat) if pinned else HostCopy(flat.to("cpu")), shapes)


Row = TypeVar("Row", bound=tuple[torch.Tensor | None, ...])


def rows_to_host(rows: list[Row]) -> list[Row]:
    """Each row's tensors (None where a row has none) on the host, float32, through one packed copy
    (to_host_packed) for all of them: a batch's per-text (maps, hidden state, value products)."""
    host = iter(to_host_packed([t for row in rows for t in row if t is not None]).ready())
    return [cast(Row, tuple(None if t is None else next(host) for t in row)) for row in rows]  # rows' order
