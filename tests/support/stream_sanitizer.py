"""A CPU stream sanitizer for the activation offloader's device interface (tests only).

``SimulatedDevice`` runs each copy at once: it shows which calls
``ActivationOffloader`` makes, not that they are enough.  On a GPU a copy on
the side stream runs whenever the streams allow; a missing wait, a host buffer
given back to its pool too early, or the caching allocator handing an
activation's memory to compute while the side stream still reads it corrupts
activations silently.  CUDA's answer (``torch.cuda._sanitizer``) needs a GPU;
:class:`StreamSanitizer` is its CPU counterpart for our device interface.

* Streams.  Compute is the host program: eager, in program order, one
  timeline for every virtual device.  Each virtual device has a side stream
  whose copies are only queued; they run when something forces them (compute
  waiting for that stream, end of step) or earlier, at seeded random points
  (any device call or compute op; a lease's release is taken in at the next
  one), in any order the recorded edges allow.
* Happens-before.  Vector clocks, as in torch.cuda._sanitizer: each compute op
  (seen through a TorchDispatchMode) is a compute epoch, each queued copy a
  side epoch; ``wait(a, b)`` orders a's later work after b's work so far.
* Memory, tracked per storage: host pool buffers, staging buffers, and an
  activation from its copy to the host until the program frees it.  A race is
  an access from one stream to memory another stream wrote (or, for a write,
  still reads) with no edge between them; a side copy not ordered after
  compute's latest work (which may have made, or still read, that memory);
  an activation or staging buffer freed while a side access to it is unknown
  to compute (the caching allocator may give it to compute's next op); a host
  buffer read after its lease went back to the pool.  New buffers are
  poisoned (0xFF: NaN in every float dtype), a copy from freed memory copies
  poison, and a released host buffer is poisoned on the side stream that used
  it, behind the work already queued there (FIFO order is what makes pool
  reuse safe), so late reads corrupt gradients visibly.

Limits: compute streams of different virtual devices share one timeline (a
wait on the wrong device's compute stream is not caught); compute's accesses
are checked per op only against memory with side accesses compute does not
know of (elsewhere no compute access can race); a compute read of memory a
queued copy still writes is reported, not waited for (a GPU would not wait
either); the pool's acquire is not seen (its effect is: the next copy writes
the buffer).
"""

from __future__ import annotations

import collections
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

COMPUTE = "compute"
POISON_BYTE = 0xFF
#: chance, at each scheduling point, that queued side work runs early; one per schedule (seeded).
#: 0.0 runs work only when forced (the longest delays), 1.0 at the first point after it was queued.
EAGERNESS = (0.0, 0.05, 0.2, 0.5, 0.8, 1.0)
KEPT_MESSAGES = 12


@dataclass(frozen=True)
class Stream:
    name: str
    index: int  # virtual device (-1: compute, all devices)


@dataclass(eq=False)
class Work:
    epoch: int
    after: Dict[str, int]  # other side streams' epochs that must have run first
    run: Callable[[], None]
    queued_at: int  # scheduling point when queued


@dataclass(eq=False)
class SideQueue:
    stream: Stream
    epoch: int = 0  # last queued
    done: int = 0  # last run
    knows: Dict[str, int] = field(default_factory=dict)  # vector clock of the next queued work
    work: Deque[Work] = field(default_factory=collections.deque)


@dataclass(eq=False)
class Memory:
    label: str
    key: int  # the storage's address (a weak reference keeps it from being reused while tracked)
    host: bool
    keep: Any  # host: the buffer (kept alive, as a pinned block is); device: StorageWeakRef
    writer: Optional[Tuple[str, int]] = None
    readers: Dict[str, int] = field(default_factory=dict)
    side: Dict[str, int] = field(default_factory=dict)  # latest access per side stream
    owner: Optional[str] = None  # the side stream that used it last
    released: bool = False  # host buffer back in its pool, not written since
    read_back: bool = True  # host buffer: its last side write was read back


@dataclass(frozen=True)
class Race:
    kind: str
    message: str


@dataclass(frozen=True)
class _Ref:
    """What a queued copy touches: a host view (strong) or device memory (weak, like the GPU's)."""

    tensor: Optional[torch.Tensor] = None
    weak: Optional[StorageWeakRef] = None
    layout: Tuple = ()

    def get(self) -> Optional[torch.Tensor]:
        if self.tensor is not None:
            return self.tensor
        storage = torch.UntypedStorage._new_with_weak_ptr(self.weak.cdata)
        if storage is None:
            return None
        offset, size, stride, dtype = self.layout
        return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)


def _storage_key(tensor: torch.Tensor) -> Optional[int]:
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # no storage (sparse, functional wrappers)
        return None


def _poison(tensor: torch.Tensor) -> None:
    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(POISON_BYTE if tensor.dtype == torch.uint8 else -1)


class _ComputeOps(TorchDispatchMode):
    """Every aten op the host program runs is compute work (ops run inside the handler bypass it)."""

    def __init__(self, sanitizer: "StreamSanitizer") -> None:
        super().__init__()
        self.sanitizer = sanitizer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.sanitizer._compute_op(func, args, kwargs)
        return func(*args, **kwargs)


class StreamSanitizer:
    """A device for ``ActivationOffloader.use_device`` (see the module docstring)."""

    name = "sanitizer"

    def __init__(self, seed: int = 0, eagerness: Optional[float] = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.eagerness = self.rng.choice(EAGERNESS) if eagerness is None else eagerness
        self.compute = Stream(COMPUTE, -1)
        self._current = self.compute
        self._sides: Dict[str, SideQueue] = {}
        self.compute_epoch = 0
        self.compute_knows: Dict[str, int] = {}
        self._memories: Dict[int, Memory] = {}
        self._unsynced: Dict[int, Memory] = {}  # side accesses compute does not know of
        self._unsynced_device: Dict[int, Memory] = {}  # those of them the program may free
        self._queued = 0
        self._released: List[torch.Tensor] = []  # from host_buffer_released, handled at the next point
        self._internal = 0
        self._devices = [0]
        self._points = 0
        self.races: List[Race] = []
        self.race_kinds: collections.Counter = collections.Counter()
        self.stats: collections.Counter = collections.Counter()

    # -- the device interface (hotfix/checkpointing/offload/devices.py) -------------------
    def handles(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu"

    def device_of(self, tensor: torch.Tensor) -> torch.device:
        return torch.device("cpu", self._devices[-1])

    def compute_stream(self, device: torch.device) -> Stream:
        return self.compute

    def side_stream(self, device: torch.device) -> Stream:
        name = f"side:{device.index or 0}"
        if name not in self._sides:
            self._sides[name] = SideQueue(Stream(name, device.index or 0))
        return self._sides[name].stream

    def wait(self, waiter: Stream, waited: Stream) -> None:
        self._point()
        self.stats[f"wait {waiter.name} <- {waited.name}"] += 1
        if waiter.name == waited.name:
            return
        if waiter.name == COMPUTE:
            queue = self._sides[waited.name]
            # compute is eager: what it waits for (and what that waited for) must be done now
            for name, epoch in queue.knows.items():
                if name != COMPUTE:
                    self._complete(self._sides[name], epoch)
            self._complete(queue, queue.epoch)
            self._merge(self.compute_knows, queue.knows)
            self._merge(self.compute_knows, {waited.name: queue.epoch})
            self._prune()
            return
        queue = self._sides[waiter.name]
        if waited.name == COMPUTE:
            self._merge(queue.knows, self.compute_knows)
            self._merge(queue.knows, {COMPUTE: self.compute_epoch})
        else:
            other = self._sides[waited.name]
            self._merge(queue.knows, other.knows)
            self._merge(queue.knows, {waited.name: other.epoch})

    @contextlib.contextmanager
    def on(self, stream: Stream) -> Iterator[None]:
        previous, self._current = self._current, stream
        try:
            yield
        finally:
            self._current = previous

    def new_host_buffer(self, nbytes: int) -> torch.Tensor:
        self._point()
        with self._own_ops():
            buffer = torch.full((nbytes,), POISON_BYTE, dtype=torch.uint8)
        self.stats["host buffers allocated"] += 1
        self._track(buffer, host=True, label=f"host buffer #{self.stats['host buffers allocated']}")
        return buffer

    def new_device_buffer(self, nbytes: int, device: torch.device) -> torch.Tensor:
        self._point()
        with self._own_ops():
            buffer = torch.full((nbytes,), POISON_BYTE, dtype=torch.uint8)
        self.stats["staging buffers allocated"] += 1
        self._track(buffer, host=False,
                    label=f"staging buffer #{self.stats['staging buffers allocated']} (device {device.index or 0})")
        return buffer

    def copy(self, dst: torch.Tensor, src: torch.Tensor, direction: str) -> None:
        self._point()
        stream = self._current
        if stream.name == COMPUTE:  # a copy on compute is one more eager compute op
            dst.copy_(src)
            return
        queue = self._sides[stream.name]
        queue.epoch += 1
        knows = dict(queue.knows, **{stream.name: queue.epoch})
        what = f"{direction} copy #{queue.epoch} on {stream.name}"
        self.stats[f"copies {direction} on {stream.name}"] += 1
        new_label = "activation" if direction == "to_host" else "untracked memory"
        touched = [(self._memories.get(_storage_key(tensor)) or self._track(tensor, host=False, label=new_label),
                    tensor, write) for tensor, write in ((src, False), (dst, True))]
        if knows.get(COMPUTE, 0) < self.compute_epoch:
            self._race("side-before-compute",
                       f"{what} ({touched[0][0].label} -> {touched[1][0].label}) is not ordered after compute's "
                       f"latest work (compute epoch {self.compute_epoch}, {stream.name} knows "
                       f"{knows.get(COMPUTE, 0)}), which may have made or still read that memory: "
                       f"missing wait({stream.name}, compute)")
        refs = []
        for memory, tensor, write in touched:
            self._side_access(memory, stream.name, queue.epoch, knows, write, what)
            if memory.host:
                memory.read_back = not write
                refs.append(_Ref(tensor=tensor))
            else:
                refs.append(_Ref(weak=memory.keep, layout=(tensor.storage_offset(), tuple(tensor.size()),
                                                           tuple(tensor.stride()), tensor.dtype)))
        src_ref, dst_ref = refs

        def run() -> None:
            target, source = dst_ref.get(), src_ref.get()
            if target is None:
                self.stats["copies into freed memory"] += 1
            elif source is None:
                _poison(target)
                self.stats["copies from freed memory (poison)"] += 1
            else:
                target.copy_(source)

        self._enqueue(queue, run)

    def host_buffer_released(self, buffer: torch.Tensor) -> None:
        """HostLease.release (maybe from __del__, in the middle of anything): handled at the next point."""
        self._released.append(buffer)

    # -- what the tests drive --------------------------------------------------
    @contextlib.contextmanager
    def tracking(self) -> Iterator["StreamSanitizer"]:
        """One training step: compute ops are watched; at the end every stream is synchronised."""
        with _ComputeOps(self):
            yield self
        self.synchronize()

    def enter_device(self, index: int) -> None:
        """Tensors the offloader gets from now on live on virtual device ``index`` (a module's forward pre-hook)."""
        self._devices.append(index)

    def leave_device(self) -> None:
        if len(self._devices) > 1:
            self._devices.pop()

    def synchronize(self) -> None:
        """End of step (torch.cuda.synchronize): all queued work runs, compute knows every stream."""
        self._point()
        for name, queue in self._sides.items():
            self._complete(queue, queue.epoch)
            self._merge(self.compute_knows, {name: queue.epoch})
        self._unsynced.clear()
        self._unsynced_device.clear()
        for key in [k for k, m in self._memories.items() if not m.host and m.keep.expired()]:
            del self._memories[key]

    def summary(self) -> dict:
        return dict(races=sum(self.race_kinds.values()), race_kinds=dict(self.race_kinds),
                    messages=[r.message for r in self.races], eagerness=self.eagerness, stats=dict(self.stats))

    # -- bookkeeping -------------------------------------------------------------
    @contextlib.contextmanager
    def _own_ops(self) -> Iterator[None]:
        self._internal += 1
        try:
            yield
        finally:
            self._internal -= 1

    @staticmethod
    def _merge(clock: Dict[str, int], other: Dict[str, int]) -> None:
        for name, epoch in other.items():
            if clock.get(name, 0) < epoch:
                clock[name] = epoch

    def _race(self, kind: str, message: str) -> None:
        self.race_kinds[kind] += 1
        if len(self.races) < KEPT_MESSAGES:
            self.races.append(Race(kind, message))

    def _track(self, tensor: torch.Tensor, host: bool, label: str) -> Memory:
        key = _storage_key(tensor)
        memory = self._memories.get(key)
        if memory is None:
            keep = tensor if host else StorageWeakRef(tensor.untyped_storage())
            memory = self._memories[key] = Memory(label=label, key=key, host=host, keep=keep)
        return memory

    def _access(self, memory: Memory, stream: str, epoch: int, knows: Dict[str, int], write: bool, what: str) -> None:
        verb = "writes" if write else "reads"
        if memory.released and not write:
            self._race("use-after-release", f"{what} reads {memory.label} after its lease gave it back to the pool")
        if memory.writer and memory.writer[0] != stream and knows.get(memory.writer[0], 0) < memory.writer[1]:
            self._race("unordered", f"{what} {verb} {memory.label}, written by {memory.writer[0]} "
                                    f"(epoch {memory.writer[1]}) with no edge between them")
        if not write:
            memory.readers[stream] = max(memory.readers.get(stream, 0), epoch)
            return
        for reader, read_epoch in memory.readers.items():
            if reader != stream and knows.get(reader, 0) < read_epoch:
                self._race("unordered", f"{what} writes {memory.label} while {reader} may still read it "
                                        f"(epoch {read_epoch}): no edge between them")
        memory.writer, memory.readers, memory.released = (stream, epoch), {}, False

    def _side_access(self, memory: Memory, stream: str, epoch: int, knows: Dict[str, int], write: bool,
                     what: str) -> None:
        self._access(memory, stream, epoch, knows, write, what)
        memory.side[stream] = epoch
        memory.owner = stream
        self._unsynced[memory.key] = memory
        if not memory.host:
            self._unsynced_device[memory.key] = memory

    def _prune(self) -> None:
        for key in [k for k, m in self._unsynced.items()
                    if all(self.compute_knows.get(s, 0) >= e for s, e in m.side.items())]:
            del self._unsynced[key]
            self._unsynced_device.pop(key, None)

    def _enqueue(self, queue: SideQueue, run: Callable[[], None]) -> None:
        after = {name: epoch for name, epoch in queue.knows.items() if name not in (COMPUTE, queue.stream.name)}
        queue.work.append(Work(queue.epoch, after, run, self._points))
        self._queued += 1

    def _ready(self, work: Work) -> bool:
        return all(self._sides[name].done >= epoch for name, epoch in work.after.items())

    def _run(self, queue: SideQueue, early: bool) -> None:
        work = queue.work.popleft()
        self._queued -= 1
        with self._own_ops():
            work.run()
        queue.done = work.epoch
        self.stats["ran early" if early else "ran when forced"] += 1
        self.stats["most points a copy waited"] = max(self.stats["most points a copy waited"],
                                                       self._points - work.queued_at)

    def _complete(self, queue: SideQueue, upto: int) -> None:
        while queue.done < upto:
            for name, epoch in queue.work[0].after.items():
                self._complete(self._sides[name], epoch)
            self._run(queue, early=False)

    # -- scheduling points ------------------------------------------------------
    def _point(self) -> None:
        if self._internal:
            return
        self._points += 1
        while self._released:
            self._handle_release(self._released.pop(0))
        if self._unsynced_device:
            self._check_frees()
        if self.eagerness and self._queued:
            while self.rng.random() < self.eagerness:
                ready = [q for q in self._sides.values() if q.work and self._ready(q.work[0])]
                if not ready:
                    break
                self._run(self.rng.choice(ready), early=True)

    def _handle_release(self, buffer: torch.Tensor) -> None:
        memory = self._memories.get(_storage_key(buffer))
        if memory is None:
            return
        self.stats["host buffers released"] += 1
        if not memory.read_back:
            self.stats["released without a copy back (graph dropped)"] += 1
        if memory.owner is None:
            with self._own_ops():
                buffer.fill_(POISON_BYTE)
        else:
            # The pool's next user is a later copy on the same side stream: poison it there, behind
            # the work already queued (a copy back queued after the release then reads poison).
            queue = self._sides[memory.owner]
            queue.epoch += 1
            knows = dict(queue.knows, **{queue.stream.name: queue.epoch})
            self._side_access(memory, queue.stream.name, queue.epoch, knows, True, f"poison of released {memory.label}")
            self._enqueue(queue, lambda: buffer.fill_(POISON_BYTE))
            self.stats["released buffers poisoned"] += 1
        memory.released = True

    def _check_frees(self) -> None:
        for key, memory in list(self._unsynced_device.items()):
            if not memory.keep.expired():
                continue
            unknown = {s: e for s, e in memory.side.items() if self.compute_knows.get(s, 0) < e}
            self._race("freed-while-in-use",
                       f"{memory.label} freed by the program (the caching allocator may give it to compute's next "
                       f"op) while compute does not know of {unknown}: missing wait(compute, side)")
            del self._unsynced[key]
            del self._unsynced_device[key]

    def _compute_op(self, func, args, kwargs) -> None:
        if self._internal or self._current is not self.compute:
            return
        self.compute_epoch += 1
        self._point()
        unsynced = self._unsynced
        if not unsynced:  # nothing a compute access could race with
            return
        for argument, value in (*enumerate(args), *kwargs.items()):
            for tensor in (value,) if isinstance(value, torch.Tensor) else value if isinstance(value, (list, tuple)) else ():
                if isinstance(tensor, torch.Tensor):
                    memory = unsynced.get(_storage_key(tensor))
                    if memory is not None:
                        self._compute_access(func, argument, memory)

    def _compute_access(self, func, argument, memory: Memory) -> None:
        """A compute op's argument (position or name) is memory with side accesses compute does not know of."""
        schema = func._schema.arguments
        spec = (schema[argument] if isinstance(argument, int) and argument < len(schema)
                else next((a for a in schema if a.name == argument), None))
        write = bool(spec is not None and spec.alias_info is not None and spec.alias_info.is_write)
        knows = dict(self.compute_knows, **{COMPUTE: self.compute_epoch})
        self._access(memory, COMPUTE, self.compute_epoch, knows, write, f"compute op {func}")
