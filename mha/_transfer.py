"""Copies between the host and an accelerator that never wait for the accelerator.

A plain ``tensor.to("cuda")`` from ordinary (pageable) host memory, or ``.to("cpu")`` of a CUDA tensor,
waits until every kernel queued before it has run: one such copy per layer or per forward drains the
queue, and the card idles while the host launches the next kernels. Through pinned host memory with
``non_blocking`` the copy is queued like a kernel instead, and the host goes on; ``HostCopy.ready()`` waits
only when the values are read. On the CPU (and on devices other than CUDA) both are plain copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["HostCopy", "to_device", "to_host"]


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
