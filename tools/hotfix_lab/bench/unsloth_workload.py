"""The unsloth-zoo offload benchmark's child: one release, upstream vs hotfix, interleaved in one process.

    python bench/unsloth_workload.py REPS [THREADS]
        for the release on PYTHONPATH (with tools/ on PYTHONPATH too, for
        zoo_loader's CPU seam); start it with HOTFIX_DISABLE=1: see unsloth_child
"""

from __future__ import annotations

import json
import sys
import time

import torch

# ---------------------------------------------------------------------------- unsloth-zoo offload (child)
# Layer inputs of 2 x 1024 x 768 fp32 = 6 MiB (1.5 Mi elements): above the 2 MiB
# offload threshold whichever unit the release counts it in (2025.x: elements,
# 1 Mi for the bf16 buffers its init picks on a bf16 GPU; 2026.9.8+: bytes;
# hotfix: bytes).  Each layer is a rank-64 residual MLP (a LoRA-sized block).
ZOO_SHAPE = (2, 1024, 768)
ZOO_RANK = 64
ZOO_LAYERS = 5
ZOO_STEPS = 3  # one "training run" = this many steps, from freshly initialised offload state
OFFLOAD_PATCH = "unsloth-zoo-offload-backward"


class ZooBlock(torch.nn.Module):
    def __init__(self, d=ZOO_SHAPE[-1], r=ZOO_RANK):
        super().__init__()
        self.down = torch.nn.Linear(d, r)
        self.up = torch.nn.Linear(r, d)

    def forward(self, hidden):
        return hidden + self.up(torch.nn.functional.gelu(self.down(hidden)))


class _CopyRecorder(torch.overrides.TorchFunctionMode):
    """Entered where upstream enters its side stream: records every copy_ made there."""

    def __init__(self, sink, phase):
        super().__init__()
        self.sink, self.phase = sink, phase

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "copy_":
            dst = args[0]
            self.sink.append((self.phase[0], dst.numel() * dst.element_size()))
        return func(*args, **(kwargs or {}))


def _storage_keys(buffers):
    keys = set()
    for b in buffers:
        if isinstance(b, torch.Tensor):
            s = b.untyped_storage()
            if s.nbytes():
                keys.add((s.data_ptr(), s.nbytes()))
    return keys


def unsloth_child(reps, threads=None):
    """Upstream vs hotfix on one unsloth-zoo release, interleaved in this process.

    Started with HOTFIX_DISABLE=1, so the release is loaded (by tools/hotfix_lab/infra/zoo_loader.py,
    on CPU) and unsloth's swap installed with hotfix inactive; then hotfix is
    activated on the loaded module, as tests/versions/test_unsloth_zoo_fixes.py does, and each
    repetition switches variant with hotfix.revert() / hotfix.activate() (revert
    puts the release's own staticmethods back; checked below before every run).

    Every run is a fresh training run of ZOO_STEPS steps: upstream's module state
    reset by zoo_loader.cpu_initialize (its offload branch runs CPU->CPU through
    fake streams; MINIMUM_SIZE as the release's init sets it on a bf16 GPU), and
    hotfix's offloader switched to a new SimulatedDevice.  Measured per step:
    bytes copied to the host during forward (upstream: every copy_ made inside its
    side-stream context; hotfix: the SimulatedDevice log), layers offloaded, new
    host buffers, step time (forward + backward), and the gradients against a run
    without checkpointing.
    """
    import contextlib
    import io
    import os

    from hotfix_lab.infra import zoo_loader

    if threads:
        torch.set_num_threads(threads)
    assert os.environ.get("HOTFIX_DISABLE"), "start with HOTFIX_DISABLE=1 (the release must load unpatched)"
    import hotfix
    from hotfix.diagnostics.compare import collect_grads, compare_grads
    from hotfix_lab.infra.simulated_device import SimulatedDevice
    from hotfix.registry import registry

    gc = zoo_loader.load_release()
    zoo_loader.install_unsloth_swap(gc)
    from importlib import metadata

    version = metadata.version("unsloth-zoo")
    upstream_forward = gc.UnslothCheckpointFunction.__dict__["forward"].__func__
    os.environ.pop("HOTFIX_DISABLE")
    assert hotfix.activate()
    patches = registry.patches()
    applied = sorted(n for n, p in patches.items() if p.applied and n.startswith("unsloth-zoo"))
    offload_patch = patches[OFFLOAD_PATCH] if OFFLOAD_PATCH in applied else None
    # MINIMUM_SIZE: elements before 2026.9.8 (2 MiB // 2 for the bf16 buffers init picks), bytes from then on.
    minimum_size = 2 * 1024 * 1024 if "FP32_OFFLOAD_EXACT" in gc.__dict__ else 2 * 1024 * 1024 // 2

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[ZooBlock() for _ in range(ZOO_LAYERS)])
    inputs = [torch.randn(*ZOO_SHAPE, generator=torch.Generator().manual_seed(s)) for s in range(ZOO_STEPS)]

    def grads():
        return collect_grads(model)

    def forward_backward(x, checkpointed, phase=None):
        model.zero_grad(set_to_none=True)
        h = x.clone().requires_grad_(True)
        started = time.perf_counter()
        for layer in model:
            h = gc.UnslothCheckpointFunction.apply(layer, True, h) if checkpointed else layer(h)
        if phase is not None:
            phase[0] = "backward"
        h.sum().backward()
        return time.perf_counter() - started

    references = []
    for x in inputs:
        forward_backward(x, False)
        references.append(grads())

    def use(variant):
        if variant == "upstream":
            hotfix.revert()
            assert gc.UnslothCheckpointFunction.__dict__["forward"].__func__ is upstream_forward
            assert "apply" not in gc.UnslothCheckpointFunction.__dict__
        else:
            assert hotfix.activate()
            assert "apply" in gc.UnslothCheckpointFunction.__dict__  # closure-tensors wrapper
            forward = gc.UnslothCheckpointFunction.__dict__["forward"].__func__
            assert (forward is not upstream_forward) == (offload_patch is not None)

    def run(variant):
        """One fresh training run; a list of per-step dicts."""
        use(variant)
        copies, phase = [], ["forward"]
        zoo_loader.cpu_initialize(gc, minimum_size=minimum_size)
        gc.torch_gpu_stream = gc.torch_cuda_stream = lambda stream: _CopyRecorder(copies, phase)
        device = None
        if variant == "hotfix" and offload_patch is not None:
            device = SimulatedDevice()
            offload_patch.offloader.use_device(device)  # default threshold: 2 MiB
        seen = _storage_keys(gc.CPU_BUFFERS)
        steps = []
        for x, reference in zip(inputs, references):
            copies.clear()
            phase[0] = "forward"
            log_start = len(device.log) if device else 0
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                seconds = forward_backward(x, True, phase)
            got = grads()
            error = compare_grads(reference, got).max_error  # hotfix's one rule; run.py asks for <= 1e-6
            if device is not None:  # hotfix's own offloader
                log = device.log[log_start:]
                to_host = [e[3] for e in log if e[:2] == ("copy", "to_host")]
                to_device = [e[3] for e in log if e[:2] == ("copy", "to_device")]
                host_allocs = sum(1 for e in log if e[:2] == ("alloc", "host"))
                assert not copies, "upstream's offload branch ran under the patch"
            else:  # the release's own offload code, through the seam
                to_host = [n for p, n in copies if p == "forward"]
                to_device = [n for p, n in copies if p == "backward"]
                now = _storage_keys(gc.CPU_BUFFERS)
                host_allocs = len(now - seen)
                seen |= now
            steps.append(dict(seconds=seconds, layers=len(to_host), bytes_to_host=sum(to_host),
                              bytes_to_device=sum(to_device), host_allocs=host_allocs,
                              messages=out.getvalue().count("Will smartly offload"), max_rel_error=error))
        return steps

    variants = ("upstream", "hotfix")
    for variant in variants:  # warm-up (allocator, first-call paths), not recorded
        run(variant)
    results = {v: [] for v in variants}
    for i in range(reps):  # A B, B A, ...: neither variant always runs first
        for variant in (variants if i % 2 == 0 else variants[::-1]):
            results[variant].append(run(variant))
    hotfix.activate()
    print(json.dumps(dict(version=version, applied=applied, offload_patch=offload_patch is not None,
                          minimum_size=minimum_size, threads=torch.get_num_threads(),
                          layers=ZOO_LAYERS, shape=list(ZOO_SHAPE), results=results)))

if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    unsloth_child(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
