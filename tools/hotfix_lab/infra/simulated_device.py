"""A CPU stand-in for the offloader's CUDA device (hotfix/checkpointing/offload/devices.py) that records what it is asked to do.

Used by the tests and benchmarks to drive hotfix's activation offloader
(hotfix/checkpointing/offload/offloader.py) without a GPU: ``offloader.use_device(SimulatedDevice())``.
Copies run at once, in program order; it proves the calls are made, and the
tests' stream-ordering device (tests/support/) proves they are enough.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, List

import torch


@dataclass(frozen=True)
class SimulatedStream:
    name: str


class SimulatedDevice:
    """A CPU stand-in for :class:`CudaDevice` that records what it is asked to do.

    ``log`` holds tuples, in order:

    * ``("wait", waiter, waited)``            stream names
    * ``("copy", direction, stream, nbytes)`` direction "to_host" / "to_device";
      stream is the stream *current* when the copy ran
    * ``("alloc", "host" | "device", nbytes)``

    Copies are real ``copy_`` calls between CPU tensors, so results (and the
    gradients computed from reloaded inputs) are exact.
    """

    name = "simulated"
    COMPUTE = SimulatedStream("compute")
    SIDE = SimulatedStream("side")

    def __init__(self) -> None:
        self.log: List[tuple] = []
        self._current = self.COMPUTE

    def handles(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu"

    def device_of(self, tensor: torch.Tensor) -> torch.device:
        return tensor.device

    def compute_stream(self, device: torch.device) -> SimulatedStream:
        return self.COMPUTE

    def side_stream(self, device: torch.device) -> SimulatedStream:
        return self.SIDE

    def wait(self, waiter: SimulatedStream, waited: SimulatedStream) -> None:
        self.log.append(("wait", waiter.name, waited.name))

    @contextlib.contextmanager
    def on(self, stream: SimulatedStream) -> Iterator[None]:
        previous, self._current = self._current, stream
        try:
            yield
        finally:
            self._current = previous

    def new_host_buffer(self, nbytes: int) -> torch.Tensor:
        self.log.append(("alloc", "host", nbytes))
        return torch.empty(nbytes, dtype=torch.uint8)

    def new_device_buffer(self, nbytes: int, device: torch.device) -> torch.Tensor:
        self.log.append(("alloc", "device", nbytes))
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, direction: str) -> None:
        self.log.append(("copy", direction, self._current.name, dst.numel() * dst.element_size()))
        dst.copy_(src)

    def allocations(self, kind: str = "host") -> int:
        """How many buffers of ``kind`` ("host" / "device") were allocated so far."""
        return sum(1 for entry in self.log if entry[:2] == ("alloc", kind))
