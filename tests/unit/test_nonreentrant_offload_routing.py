"""patches/unsloth_zoo_nonreentrant_offload.py in-process: which non-reentrant calls are routed to unsloth's checkpoint.

A stand-in release module (``unsloth_zoo.gradient_checkpointing`` whose ``UnslothCheckpointFunction``
is torch's reentrant Function, counting its forwards) and unsloth's swap of torch's
``CheckpointFunction``; the fix's slot wrapper around what transformers stores,
``partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)``.  Routed only where the swap is in
place and the call holds nothing a reentrant checkpoint refuses; gradients equal a run without
checkpointing; the real releases are tests/versions/test_unsloth_zoo_nonreentrant_offload.py.
"""

from __future__ import annotations

import functools
import sys
import types

import pytest
import torch
import torch.utils.checkpoint as tuc
import wrapt

from hotfix.diagnostics.compare import collect_grads, compare_grads
from hotfix.patches import unsloth_zoo_nonreentrant_offload as fix_module
from hotfix.checkpointing.unsloth import CLASS_NAME, MODULE

#: the fix the routing relies on under a searching DDP forward (hotfix.relations.RELIANCES)
DDP_FIX = "transformers-ddp-find-unused"


class RecordingFix:
    """What the wrapper reports through: its repaired() and warn_once() calls; the fixes it relies on, applied
    (this process's registry is not asked: ``missing`` answers)."""

    name = fix_module.UnslothZooNonreentrantOffload.name

    def __init__(self, missing=lambda under_ddp=False: []):
        self.repairs, self.warnings = [], []
        self.applied_targets = ("transformers.modeling_utils", MODULE)
        self.missing = missing

    def repaired(self, what, call=None):
        self.repairs.append(what)

    def warn_once(self, key, message):
        self.warnings.append(message)


@pytest.fixture
def release(monkeypatch):
    """A loaded release module; ``release.swap()`` is unsloth's request (undone after the test)."""
    forwards, torchs = [], tuc.CheckpointFunction

    class UnslothCheckpointFunction(torchs):
        @staticmethod
        def forward(ctx, run_function, preserve_rng_state, *args):
            forwards.append(len(args))
            return torchs.forward(ctx, run_function, preserve_rng_state, *args)

    module = types.ModuleType(MODULE)
    setattr(module, CLASS_NAME, UnslothCheckpointFunction)
    module.forwards = forwards
    module.swap = lambda: monkeypatch.setattr(tuc, "CheckpointFunction", UnslothCheckpointFunction)
    monkeypatch.setitem(sys.modules, MODULE, module)
    return module


def _layers():
    torch.manual_seed(0)
    return torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])


def _step(layers, stored=None, fix=None, **call_kwargs):
    """One step over the layers; each layer call through the slot wrapper around ``stored`` (None: no checkpoint)."""
    layers.zero_grad(set_to_none=True)
    hidden = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    checkpoint = None if stored is None else wrapt.FunctionWrapper(stored, fix_module.checkpoint_routed_to_unsloth(fix))
    for layer in layers:
        call = functools.partial(lambda layer, h: torch.tanh(layer(h)), layer)
        hidden = call(hidden) if checkpoint is None else checkpoint(call, hidden, **call_kwargs)
    hidden.sum().backward()
    return collect_grads(layers)


def test_a_non_reentrant_call_reaches_unsloths_function_once_it_was_asked_for(release):
    layers, fix = _layers(), RecordingFix()
    reference = _step(layers)
    stored = functools.partial(tuc.checkpoint, use_reentrant=False)  # transformers 5.x / TRL
    assert compare_grads(reference, _step(layers, stored, fix)).ok
    assert release.forwards == [] and fix.repairs == []  # never asked: non-reentrant, as the user chose

    release.swap()
    assert compare_grads(reference, _step(layers, stored, fix)).ok
    assert release.forwards == [1, 1, 1]  # every layer through unsloth's function
    assert len(fix.repairs) == 3 and "use_reentrant=False" in fix.repairs[0]

    del release.forwards[:]  # the release drifted (the fix skipped it): left alone
    fix.applied_targets = ("transformers.modeling_utils",)
    assert compare_grads(reference, _step(layers, stored, fix)).ok and release.forwards == [] and len(fix.repairs) == 3


def test_the_unsloth_checkpoint_of_the_release_is_routed_too(release, monkeypatch):
    """A partial of the release's own drop-in (transformers imported after unsloth's patch)."""
    def unsloth_checkpoint(function, *args, use_reentrant=None, **kwargs):
        if use_reentrant is False:
            return tuc.checkpoint(function, *args, use_reentrant=False, **kwargs)
        return getattr(release, CLASS_NAME).apply(function, kwargs.pop("preserve_rng_state", True), *args)

    release.unsloth_checkpoint = unsloth_checkpoint
    release.swap()
    layers, fix = _layers(), RecordingFix()
    reference = _step(layers)
    assert compare_grads(reference, _step(layers, functools.partial(unsloth_checkpoint, use_reentrant=False), fix)).ok
    assert release.forwards == [1, 1, 1] and len(fix.repairs) == 3
    # someone else's function of that name is not the release's: left alone
    del release.forwards[:]
    other = functools.partial(lambda f, *a, **k: tuc.checkpoint(f, *a, **k), use_reentrant=False)
    assert compare_grads(reference, _step(layers, other, fix)).ok and release.forwards == []


@pytest.mark.parametrize("stored, call_kwargs", [
    (functools.partial(tuc.checkpoint, use_reentrant=False, context_fn=tuc.noop_context_fn), {}),
    (functools.partial(tuc.checkpoint, use_reentrant=False), {"determinism_check": "none"}),
])
def test_a_call_with_what_only_non_reentrant_takes_stays_non_reentrant(release, stored, call_kwargs):
    release.swap()
    layers, fix = _layers(), RecordingFix()
    reference = _step(layers)
    assert compare_grads(reference, _step(layers, stored, fix, **call_kwargs)).ok
    assert release.forwards == [] and fix.repairs == []
    assert fix.warnings and "stays bypassed" in fix.warnings[0]


@pytest.mark.filterwarnings("ignore:torch.utils.checkpoint. the use_reentrant parameter")  # the bare function
def test_reentrant_calls_are_unsloths_path_already(release):
    release.swap()
    layers, fix = _layers(), RecordingFix()
    reference = _step(layers)
    for stored in (functools.partial(tuc.checkpoint, use_reentrant=True), tuc.checkpoint):
        del release.forwards[:]
        assert compare_grads(reference, _step(layers, stored, fix)).ok
        assert release.forwards == [1, 1, 1]
    assert fix.repairs == []  # nothing was bypassed: nothing repaired


def test_under_a_searching_ddp_forward_only_with_the_ddp_fix(release, monkeypatch):
    from torch.nn.parallel import DistributedDataParallel

    release.swap()
    asked = []
    layers, fix = _layers(), RecordingFix(lambda under_ddp=False: asked.append(under_ddp) or
                                          ([DDP_FIX] if under_ddp else []))
    reference = _step(layers)
    searching = types.SimpleNamespace(find_unused_parameters=True, static_graph=False, require_backward_grad_sync=True)
    monkeypatch.setattr(DistributedDataParallel, "_active_ddp_module", searching, raising=False)
    stored = functools.partial(tuc.checkpoint, use_reentrant=False)
    assert compare_grads(reference, _step(layers, stored, fix)).ok
    assert release.forwards == [] and fix.repairs == [] and fix.warnings and DDP_FIX in fix.warnings[0]
    assert "DistributedDataParallel" in fix.warnings[0] and True in asked
    # static_graph (or no_sync): DDP does not search, reentrant needs no DDP fix
    searching.static_graph = True
    assert compare_grads(reference, _step(layers, stored, fix)).ok and release.forwards == [1, 1, 1]
    assert asked[-1] is False


def test_without_the_fixes_reentrant_calls_need_the_call_stays_non_reentrant(release):
    """transformers-checkpoint-layer-io opted out: routed, a Whisper-style call would crash; left alone, said once.
    The fix's own ``missing`` over the fixes bound to it (``hotfix.relations``), one of them not applied."""
    from hotfix import relations

    release.swap()
    fix = fix_module.UnslothZooNonreentrantOffload()
    others = {name: types.SimpleNamespace(name=name, applied=name != "transformers-checkpoint-layer-io")
              for name in ("transformers-checkpoint-layer-io", "transformers-frozen-inputs", DDP_FIX)}
    fix.bind_reliances(relations.reliances_of(fix.name, others))
    assert fix.missing() == ["transformers-checkpoint-layer-io"]
    fix.repairs, fix.warnings = [], []
    fix.repaired = lambda what, call=None: fix.repairs.append(what)
    fix.warn_once = lambda key, message: fix.warnings.append(message)
    fix._applied_targets.append(MODULE)
    layers = _layers()
    reference = _step(layers)
    assert compare_grads(reference, _step(layers, functools.partial(tuc.checkpoint, use_reentrant=False), fix)).ok
    assert release.forwards == [] and fix.repairs == []
    assert fix.warnings and "transformers-checkpoint-layer-io" in fix.warnings[0]


def test_the_declared_ranges_leave_out_the_releases_the_census_measures_otherwise():
    """The release ranges as data (read without torch): the first offloading release to the last that bypasses,
    less the two whose function transformers never reaches."""
    from packaging.specifiers import SpecifierSet

    patch = fix_module.patch
    for mechanism in patch.mechanisms:
        spec = SpecifierSet(mechanism.affected["unsloth-zoo"])
        assert {v for v in ("2024.12.7", "2025.1.1", "2025.6.3", "2025.6.4", "2025.6.5", "2026.3.2", "2026.3.3")
                if spec.contains(v)} == {"2025.1.1", "2025.6.5", "2026.3.2"}
        assert mechanism.fixed_in == patch.fixed_in == "2026.3.3"
        assert SpecifierSet(mechanism.unreached["unsloth-zoo"]).contains("2025.6.4")
