"""Host offload of a checkpoint's first input, behind a small device interface (unsloth-zoo-offload-backward).

unsloth's smart checkpointing keeps each checkpointed layer's input on the host between
forward and backward: copied out on a side stream while the layer runs, copied back into a
staging buffer before recomputation.  :class:`ActivationOffloader` holds all that state (host
buffer pools and staging buffer per device, the layer schedule, the print-once flag); the
device (``checkpointing.offload.devices.CudaDevice``, or the tests' CPU devices) does the streams, copies
and allocations.  Stream order: forward = side waits for compute, copy out, compute waits for
side before the activation's memory can be reused; backward = side waits for compute, copy
back, compute waits for side before reading it.  A host buffer returns to its pool only after
its copy back is queued on the same side stream, which orders its next writer (pools are per
device for that reason).  Proven on CPU by tests/versions/test_offload_stream_order.py; the
reasoning in full: docs/fixes/unsloth-zoo-offload-backward.md.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from hotfix.checkpointing.offload.devices import CudaDevice, HostBufferPool, HostLease, round_up

#: printed (stdout, like upstream) the first time an activation is offloaded;
#: the exact text unsloth prints, so logs and user expectations do not change.
OFFLOAD_MESSAGE = "Unsloth: Will smartly offload gradients to save VRAM!"
#: unsloth offloads only inputs larger than 2 MiB (smaller ones are cheaper to keep)
DEFAULT_THRESHOLD_BYTES = 2 * 1024 * 1024


def _device_key(device: torch.device) -> Tuple[str, int]:
    return (device.type, -1 if device.index is None else device.index)


# ---------------------------------------------------------------------------
# schedule: which calls to offload
# ---------------------------------------------------------------------------
class LayerSchedule:
    """Counts checkpoint calls per pass to spot the last layer.

    The last checkpointed layer of a forward is the first one to run backward,
    so offloading it costs a round trip for no memory saved (torchtune#1443).
    Its position is only known once the first pass has ended (first backward),
    so the first pass offloads every layer; from then on the last one stays.
    """

    def __init__(self) -> None:
        self.layers: Optional[int] = None  # checkpoint calls per pass, once known
        self.position = 0  # calls so far in this pass (1-based after next_call)
        self.passes = 0  # passes started
        self._backward_seen = True

    def next_call(self) -> int:
        if self._backward_seen:
            self._backward_seen = False
            self.passes += 1
            self.position = 0
        self.position += 1
        return self.position

    def backward_started(self) -> None:
        if self.layers is None and self.position:
            self.layers = self.position
        self._backward_seen = True

    def is_last(self, position: int) -> bool:
        return self.layers is not None and position == self.layers


# ---------------------------------------------------------------------------
# the offloader
# ---------------------------------------------------------------------------
@dataclass
class Offloaded:
    """What forward keeps (on ctx) instead of the activation itself."""

    lease: HostLease
    nbytes: int
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    position: int
    pass_number: int

    def host_view(self) -> torch.Tensor:
        return self.lease.buffer[: self.nbytes].view(self.dtype).view(self.shape)


@dataclass
class OffloadStats:
    #: pass number -> positions offloaded in that pass (1-based call numbers)
    offloaded: Dict[int, List[int]] = field(default_factory=dict)
    #: pass number -> positions kept on the device (below threshold / last layer)
    kept: Dict[int, List[int]] = field(default_factory=dict)
    reloads: int = 0


class ActivationOffloader:
    """All offload state of one process (one instance per hotfix patch)."""

    def __init__(
        self,
        device: Optional[Any] = None,
        threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        announce: Callable[[str], None] = print,
    ) -> None:
        self._lock = threading.RLock()
        self._recompute = threading.local()
        self.announce = announce
        self.threshold_bytes = threshold_bytes
        self.use_device(device or CudaDevice())

    # -- configuration -------------------------------------------------------
    def use_device(self, device: Any, threshold_bytes: Optional[int] = None) -> None:
        """Switch device implementation (tests, benchmarks); forgets all state."""
        with self._lock:
            self.device = device
            if threshold_bytes is not None:
                self.threshold_bytes = threshold_bytes
            self.reset()

    def reset(self) -> None:
        """Forget buffers, layer count and the print-once flag (a new training run)."""
        with self._lock:
            self._pools: Dict[Tuple[str, int], HostBufferPool] = {}
            self._staging: Dict[Tuple[str, int], torch.Tensor] = {}
            self.staging_allocations = 0
            self.schedule = LayerSchedule()
            self.announced = False
            self.stats = OffloadStats()

    def pool(self, device: torch.device) -> HostBufferPool:
        key = _device_key(device)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = HostBufferPool(
                self.device.new_host_buffer, getattr(self.device, "host_buffer_released", None))
        return pool

    # -- recomputation guard -------------------------------------------------
    @contextlib.contextmanager
    def recomputing(self) -> Iterator[None]:
        """Mark this thread as recomputing a checkpointed layer.

        A checkpoint nested inside the recomputation must not offload: its
        reload would overwrite the staging buffer the outer layer is reading.
        Thread-local because autograd runs backward on its own threads.
        """
        self._recompute.depth = getattr(self._recompute, "depth", 0) + 1
        try:
            yield
        finally:
            self._recompute.depth -= 1

    def in_recompute(self) -> bool:
        return getattr(self._recompute, "depth", 0) > 0

    # -- forward ---------------------------------------------------------------
    def offload(self, tensor: torch.Tensor) -> Optional[Offloaded]:
        """Called for a checkpoint's first input when it requires grad.

        Returns a ticket when the tensor was sent to the host (the caller must
        then not save it, and must call :meth:`after_forward`), else None.
        """
        if self.in_recompute():
            return None
        with self._lock:
            position = self.schedule.next_call()
            pass_number = self.schedule.passes
            nbytes = tensor.numel() * tensor.element_size()
            if (
                not self.device.handles(tensor)
                or nbytes <= self.threshold_bytes
                or self.schedule.is_last(position)
            ):
                self.stats.kept.setdefault(pass_number, []).append(position)
                return None
            # tensor.device, except where a device simulates several (the tests' stream sanitizer)
            device = self.device.device_of(tensor)
            compute = self.device.compute_stream(device)
            side = self.device.side_stream(device)
            lease = self.pool(device).acquire(nbytes)
            ticket = Offloaded(lease, nbytes, tensor.shape, tensor.dtype, device, position, pass_number)
            self.device.wait(side, compute)
            with torch.no_grad(), self.device.on(side):
                self.device.copy(ticket.host_view(), tensor.detach(), "to_host")
            self.stats.offloaded.setdefault(pass_number, []).append(position)
            if not self.announced:
                self.announced = True
                self.announce(OFFLOAD_MESSAGE)
            return ticket

    def after_forward(self, ticket: Optional[Offloaded]) -> None:
        """The layer has been queued: compute may now free/reuse the activation."""
        if ticket is not None:
            self.device.wait(self.device.compute_stream(ticket.device), self.device.side_stream(ticket.device))

    # -- backward --------------------------------------------------------------
    def backward_started(self) -> None:
        with self._lock:
            self.schedule.backward_started()

    def _staging_view(self, ticket: Offloaded) -> torch.Tensor:
        key = _device_key(ticket.device)
        buffer = self._staging.get(key)
        if buffer is None or buffer.numel() < ticket.nbytes:
            # Replace, do not resize in place: a view of the old buffer may
            # still be referenced by the previous layer's finished graph.
            buffer = self._staging[key] = self.device.new_device_buffer(round_up(ticket.nbytes), ticket.device)
            self.staging_allocations += 1
        return buffer[: ticket.nbytes].view(ticket.dtype).view(ticket.shape)

    def reload(self, ticket: Offloaded) -> torch.Tensor:
        """Bring an offloaded activation back; returns a tensor on its device."""
        with self._lock:
            compute = self.device.compute_stream(ticket.device)
            side = self.device.side_stream(ticket.device)
            staging = self._staging_view(ticket)
            self.device.wait(side, compute)
            with torch.no_grad(), self.device.on(side):
                self.device.copy(staging, ticket.host_view(), "to_device")
            self.device.wait(compute, side)
            ticket.lease.release()
            self.stats.reloads += 1
            return staging
