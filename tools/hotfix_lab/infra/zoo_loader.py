"""Load a real unsloth-zoo release's gradient_checkpointing.py on CPU.

The cases run on it live in ``zoo_cases.py`` (the script the tests start); the
benchmarks and the GPU kit's CPU self-test load releases through here too.

The release comes from sys.path (the test puts .matrix/unsloth-zoo-<ver> first
on PYTHONPATH), so importlib.metadata sees its dist-info and hotfix's version
gates see the real version.

Why stubs: ``unsloth_zoo/__init__.py`` probes for a GPU and raises without
one, and ``unsloth_zoo.device_type`` (2025.10.7+) does the same (2026.10.9's
imports but reports "cpu", so the module never defines its CUDA stream
helper).  We register a bare package object (``__path__`` only, so
``__init__`` never runs) that also carries the device names (2025.5.9 -
2025.10.6 do ``from . import DEVICE_TYPE``), and a stub ``device_type``
module; then ``import unsloth_zoo.gradient_checkpointing`` loads the real file.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types

DEVICE_ATTRS = dict(DEVICE_TYPE="cuda", DEVICE_TYPE_TORCH="cuda", DEVICE_COUNT=1, ALLOW_PREQUANTIZED_MODELS=True)
TARGET = "unsloth_zoo.gradient_checkpointing"


def zoo_dir() -> str:
    """The unsloth_zoo package directory on sys.path (found without importing).

    importlib.util.find_spec would go through hotfix's start-up finder, which
    activates hotfix on "unsloth_zoo": --late must control that moment itself.
    """
    for entry in sys.path:
        candidate = os.path.join(entry or ".", "unsloth_zoo")
        if os.path.isfile(os.path.join(candidate, "gradient_checkpointing.py")):
            return candidate
    raise SystemExit("no unsloth_zoo release on sys.path")


def install_stubs(package_dir: str) -> None:
    package = types.ModuleType("unsloth_zoo")
    package.__path__ = [package_dir]
    package.__file__ = os.path.join(package_dir, "__init__.py")  # never executed
    package.__package__ = "unsloth_zoo"
    device_type = types.ModuleType("unsloth_zoo.device_type")
    for name, value in DEVICE_ATTRS.items():
        setattr(package, name, value)
        setattr(device_type, name, value)
    device_type.is_hip = lambda: False
    device_type.get_device_type = lambda: DEVICE_ATTRS["DEVICE_TYPE"]
    package.device_type = device_type
    sys.modules["unsloth_zoo"] = package
    sys.modules["unsloth_zoo.device_type"] = device_type


def send_cuda_moves_to_the_cpu():
    """Releases before 2025.1.1 move saved tensors back with ``.to("cuda:0")`` in their backward; on a
    torch without CUDA those moves go to the CPU instead (only ``"cuda..."`` device strings are touched)."""
    torch = _torch()
    if torch.cuda.is_available() or getattr(torch.Tensor.to, "cpu_for_cuda", False):
        return
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        if args and isinstance(args[0], str) and args[0].startswith("cuda"):
            args = ("cpu",) + args[1:]
        if isinstance(kwargs.get("device"), str) and kwargs["device"].startswith("cuda"):
            kwargs["device"] = "cpu"
        return original(self, *args, **kwargs)

    to.cpu_for_cuda = True
    torch.Tensor.to = to


def load_release():
    install_stubs(zoo_dir())
    send_cuda_moves_to_the_cpu()
    import importlib

    return importlib.import_module(TARGET)


TEMPORARY_PATCHES = "unsloth_zoo.temporary_patches"


def load_temporary_patch(name: str):
    """The release's ``unsloth_zoo.temporary_patches.<name>`` (2024.10+: unsloth's patches of transformers' models),
    its package a bare one too: the package's ``__init__`` imports every patch, some of which need a GPU."""
    import importlib

    if "unsloth_zoo" not in sys.modules:
        install_stubs(zoo_dir())
    if TEMPORARY_PATCHES not in sys.modules:
        package = types.ModuleType(TEMPORARY_PATCHES)
        package.__path__ = [os.path.join(zoo_dir(), "temporary_patches")]
        package.__package__ = TEMPORARY_PATCHES
        sys.modules[TEMPORARY_PATCHES] = package
    return importlib.import_module(f"{TEMPORARY_PATCHES}.{name}")


# -- upstream module state without CUDA -------------------------------------
class FakeStream:
    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return FakeEvent()


class FakeEvent:
    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


def cpu_initialize(gc, minimum_size=None):
    """What initialize_unsloth_gradient_checkpointing sets, with CPU stand-ins.

    minimum_size None: upstream never offloads (plain checkpointing).  A number
    (in upstream's own unit): its offload branch runs CPU -> CPU through fake
    streams, so upstream's schedule can be observed.
    """
    stream = FakeStream()
    nullstream = lambda s: contextlib.nullcontext()  # noqa: E731
    state = dict(
        # pre-sized list: growing it would allocate pinned memory (needs CUDA)
        CPU_BUFFERS=[_torch().empty(0) for _ in range(8)], CPU_INDEX=0, BACKWARD_PASS=True, FIRST_PASS=True, LAST_GC_INDEX=0,
        CURRENT_GC_INDEX=0, USE_UNSLOTH_GC=True, MINIMUM_SIZE=10**15 if minimum_size is None else minimum_size,
        torch_gpu_stream=nullstream, torch_cuda_stream=nullstream,
        GPU_BUFFERS={None: _torch().empty(0)}, GPU_BUFFER=_torch().empty(0),
        MAIN_STREAMS={None: stream}, EXTRA_STREAMS={None: stream}, MAIN_STREAM=stream, EXTRA_STREAM=stream,
        GPU_BUFFERS_B=None, USE_DOUBLE_BUFFER=False, BUFFER_EVENTS_A=None, BUFFER_EVENTS_B=None,
        NEXT_BUFFER_SLOT={None: 0}, GC_PREFETCH=False,
    )
    gc.__dict__.update(state)
    # later releases' own helpers, where they exist
    if "_compute_stream" in gc.__dict__:
        gc._compute_stream = lambda index: stream
    if "_current_gpu_stream" in gc.__dict__:  # 2026.10.5 only
        gc._current_gpu_stream = lambda device: stream
    if "_ensure_device_buffers" in gc.__dict__:
        gc._ensure_device_buffers = lambda index: None
    if "_reset_cpu_slots" in gc.__dict__:
        gc._reset_cpu_slots()
    if "FP32_OFFLOAD_EXACT" in gc.__dict__:
        gc.FP32_OFFLOAD_EXACT = True
    if "PINNED_MEMORY_AVAILABLE" in gc.__dict__:
        gc.PINNED_MEMORY_AVAILABLE = False


def _torch():
    import torch

    return torch


@contextlib.contextmanager
def cpu_setup(gc):
    """The release's CUDA set-up (``initialize_unsloth_gradient_checkpointing``) stands in as ``cpu_initialize`` while
    unsloth's own patch runs, and is the release's (or hotfix's wrapper of it) again afterwards: a fix on the set-up
    (unsloth-zoo-pinned-memory) meets the release's function, not the lab's stand-in."""
    name = "initialize_unsloth_gradient_checkpointing"
    original = gc.__dict__.get(name)
    setattr(gc, name, lambda dtype=None: cpu_initialize(gc))
    try:
        yield
    finally:
        if original is not None:
            setattr(gc, name, original)


def install_unsloth_swap(gc):
    """unsloth's own patch_unsloth_smart_gradient_checkpointing, CUDA init stubbed.

    Every release swaps torch's ``CheckpointFunction`` for ``UnslothCheckpointFunction``, except
    2025.6.3 and 2025.6.4, which only replace ``torch.utils.checkpoint.checkpoint`` by their
    ``unsloth_checkpoint`` (which calls ``UnslothCheckpointFunction.apply``).  transformers bound
    ``checkpoint`` when it was imported, so there it is pointed at the release's function too.
    """
    with cpu_setup(gc):
        gc.patch_unsloth_smart_gradient_checkpointing()
    import torch.utils.checkpoint as tuc

    if tuc.CheckpointFunction is gc.UnslothCheckpointFunction:
        return
    assert getattr(tuc.checkpoint, "__name__", "") == "unsloth_checkpoint", "the release swapped neither"
    modeling_utils = sys.modules.get("transformers.modeling_utils")
    if modeling_utils is not None:
        modeling_utils.checkpoint = tuc.checkpoint
