"""Where the activation offloader's bytes live (``hotfix/checkpointing/offload/offloader.py``): the CUDA device and the host buffer pool.

A *device* does what offloading needs: say which device serves a tensor (``device_of``), name
that device's compute and side streams, make one stream wait for another, run copies on a stream,
allocate host / device buffers; it may also define ``host_buffer_released(buffer)``, which the pool
calls when a lease gives its buffer back (the tests' stream sanitizer models pool reuse with it).
:class:`CudaDevice` is the real one (pinned memory, ``non_blocking`` copies, one side stream per
GPU).  The tests and benchmarks drive the offloader with CPU devices of the same interface
(tools/hotfix_lab/infra/simulated_device.py, tests/support/stream_sanitizer.py), which do not ship.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Callable, Deque, Dict, List, Optional

import torch

logger = logging.getLogger("hotfix")

#: buffer sizes are rounded up to this many bytes so that a batch a few tokens
#: longer than the last one still fits the buffers already allocated
ROUND_BYTES = 64 * 1024


def round_up(nbytes: int) -> int:
    return max(ROUND_BYTES, -(-nbytes // ROUND_BYTES) * ROUND_BYTES)

# ---------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------
class CudaDevice:
    """Real offloading: pinned host memory, one side stream per GPU."""

    name = "cuda"

    def __init__(self) -> None:
        self._side_streams: Dict[int, Any] = {}
        self._warned_pageable = False

    def handles(self, tensor: torch.Tensor) -> bool:
        # ROCm builds report HIP tensors as cuda too.  XPU/NPU tensors are not
        # offloaded: they are saved on the device as plain checkpointing does.
        return tensor.is_cuda

    def device_of(self, tensor: torch.Tensor) -> torch.device:
        """The device whose streams, pool and staging buffer serve ``tensor``."""
        return tensor.device

    def _index(self, device: torch.device) -> int:
        return device.index if device.index is not None else torch.cuda.current_device()

    def compute_stream(self, device: torch.device) -> Any:
        # The *current* stream, not the default one: the activation was made
        # on whatever stream the caller (or autograd, in backward) runs on.
        return torch.cuda.current_stream(self._index(device))

    def side_stream(self, device: torch.device) -> Any:
        index = self._index(device)
        stream = self._side_streams.get(index)
        if stream is None:
            stream = self._side_streams[index] = torch.cuda.Stream(device=index)
        return stream

    def wait(self, waiter: Any, waited: Any) -> None:
        waiter.wait_stream(waited)

    def on(self, stream: Any):
        return torch.cuda.stream(stream)

    def new_host_buffer(self, nbytes: int) -> torch.Tensor:
        try:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as exc:
            # Pinned memory can run out (or be forbidden in containers).  A
            # pageable buffer still gives correct results; the copies just
            # stop overlapping with compute.
            if not self._warned_pageable:
                self._warned_pageable = True
                logger.warning("hotfix: pinned host memory unavailable (%s); offloading to pageable memory", exc)
            return torch.empty(nbytes, dtype=torch.uint8)

    def new_device_buffer(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, direction: str) -> None:
        dst.copy_(src, non_blocking=True)


# ---------------------------------------------------------------------------
# host buffer pool
# ---------------------------------------------------------------------------
class HostLease:
    """One host buffer lent to one offloaded activation.

    Released explicitly after the copy back; if the activation is never
    reloaded (its graph was dropped without backward) the buffer comes back
    when the lease is garbage collected.  Release only appends to a deque
    (atomic), so it is safe from ``__del__`` on any thread.  ``on_release``
    (the device's optional ``host_buffer_released``) hears of it first.
    """

    __slots__ = ("buffer", "_returns", "_released", "_on_release")

    def __init__(self, buffer: torch.Tensor, returns: Deque[torch.Tensor],
                 on_release: Optional[Callable[[torch.Tensor], None]] = None) -> None:
        self.buffer = buffer
        self._returns = returns
        self._released = False
        self._on_release = on_release

    def release(self) -> None:
        if not self._released:
            self._released = True
            try:
                if self._on_release is not None:
                    self._on_release(self.buffer)
            finally:  # an observer's failure must not lose the buffer
                self._returns.append(self.buffer)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


class HostBufferPool:
    """Host buffers of one device, reused across steps.

    ``acquire`` takes the smallest free buffer that fits.  When none fits it
    allocates a new one and drops the largest free one that was too small, so
    the pool never holds more buffers than were in use at once.
    """

    def __init__(self, allocate: Callable[[int], torch.Tensor],
                 on_release: Optional[Callable[[torch.Tensor], None]] = None) -> None:
        self._allocate = allocate
        self._on_release = on_release
        self._free: List[torch.Tensor] = []
        self._returns: Deque[torch.Tensor] = collections.deque()
        self.allocations = 0

    def _drain(self) -> None:
        while True:
            try:
                self._free.append(self._returns.popleft())
            except IndexError:
                return

    def _take(self, buffer: torch.Tensor) -> None:
        # By identity: list.remove compares with ==, which on tensors is elementwise (it raised
        # as soon as the free list held buffers of two sizes and the one taken was not first).
        del self._free[next(i for i, b in enumerate(self._free) if b is buffer)]

    def acquire(self, nbytes: int) -> HostLease:
        self._drain()
        fitting = [b for b in self._free if b.numel() >= nbytes]
        if fitting:
            buffer = min(fitting, key=lambda b: b.numel())
            self._take(buffer)
        else:
            if self._free:
                self._take(max(self._free, key=lambda b: b.numel()))
            size = round_up(nbytes)
            buffer = self._allocate(size)
            self.allocations += 1
        return HostLease(buffer, self._returns, self._on_release)
