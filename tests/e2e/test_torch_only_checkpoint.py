"""A torch-only script's first checkpoint call activates hotfix: installed, no `import hotfix`, no DDP.

torchtitan- and torchtune-style training imports torch and no trigger (transformers, unsloth) and often builds no DDP
(FSDP2, one device); its checkpoint is torch's non-reentrant one, with ``preserve_rng_state=False`` and compiled
submodules: torch-checkpoint-rng-state's and torch-compile-recompute-graph's cases.  Until 2026-11-30 hotfix stayed
off in such a process.  Now the start-up hook also watches the generator every non-reentrant checkpoint call runs
(a plain function in torch's module, no import) and, from the same day's later change, the ``apply`` every reentrant
call ends in (``CheckpointFunction.apply``): the first call of either activates hotfix and runs through the fixes.

Each case a fresh interpreter of the test venv, hotfix installed, upstream with ``HOTFIX_DISABLE=1``: two blocks
with dropout under ``checkpoint(..., preserve_rng_state=False)``, non-reentrant and reentrant, against the step
without checkpointing (upstream wrong, with hotfix equal and one "repaired" line); hotfix_lab.cases.compile_graph_order
(the recomputation runs the graph compiled last upstream, its forward's with hotfix); and the watches themselves
(torch's own generator and ``apply`` back once hotfix is active; a plain step activates nothing).
"""

from __future__ import annotations

import pytest

from conftest import json_lines, repair_notices, run_python

DROPOUT_SCRIPT = r"""
import functools, json, sys
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

REENTRANT = sys.argv[1:] == ["reentrant"]

def step(function):
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 8))
                            for _ in range(2)])
    torch.manual_seed(1)
    x = torch.randn(4, 8, requires_grad=REENTRANT)  # reentrant: an input needing grad makes the node
    for block in blocks:
        x = x + (function(block, x) if function else block(x))
    x.pow(2).sum().backward()
    return [p.grad for p in blocks.parameters()]

before = "hotfix" in sys.modules
reference = step(None)
after_plain = "hotfix" in sys.modules
got = step(functools.partial(checkpoint, use_reentrant=REENTRANT, preserve_rng_state=False))
print(json.dumps({"hotfix_before": before, "hotfix_after_plain_step": after_plain,
                  "hotfix_after": "hotfix" in sys.modules,
                  "equal": [g is not None and torch.allclose(r, g, rtol=1e-5, atol=1e-7)
                            for r, g in zip(reference, got)]}))
"""

WATCH_PROBE = r"""
import json, sys, torch
import torch.utils.checkpoint as c
first = sys.argv[1]  # the mode of the process's first checkpoint call
name = "_checkpoint_without_reentrant_generator"
seen = {"watched": c.__dict__[name].__qualname__, "watched_apply": c.CheckpointFunction.__dict__["apply"].__func__.__qualname__}
layer, x = torch.nn.Linear(2, 2), torch.randn(1, 2, requires_grad=True)
layer(x).sum().backward()
seen["hotfix_after_plain_step"] = "hotfix" in sys.modules
c.checkpoint(layer, x, use_reentrant=first == "reentrant").sum().backward()
seen["hotfix_after_first_checkpoint"] = "hotfix" in sys.modules
from hotfix.junction import hooks_on
standing = c.__dict__[name]
seen["hooks"] = list(hooks_on(standing))
seen["torch_generator_under_them"] = getattr(standing, "__wrapped__", None).__qualname__
apply = c.CheckpointFunction.__dict__.get("apply")
seen["apply_hooks"] = list(hooks_on(apply))
seen["torch_apply_under_them"] = getattr(getattr(apply, "__wrapped__", None), "__qualname__", None)
print(json.dumps(seen))
"""


def _line(args, disabled=False):
    proc = run_python(args, env={"HOTFIX_DISABLE": "1"} if disabled else None, timeout=300)
    lines = json_lines(proc.stdout)
    assert lines, proc.stderr[-3000:]
    return lines[-1], proc


@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant"])
def test_a_torch_only_script_with_preserve_rng_state_false_trains_equal_with_hotfix_installed(mode):
    upstream, _ = _line(["-c", DROPOUT_SCRIPT, mode], disabled=True)
    fixed, proc = _line(["-c", DROPOUT_SCRIPT, mode])
    assert not all(upstream["equal"]) and upstream["hotfix_after"] is False, upstream
    assert fixed["hotfix_before"] is False and fixed["hotfix_after_plain_step"] is False, fixed
    assert fixed["hotfix_after"] is True and all(fixed["equal"]), fixed
    assert any("torch-checkpoint-rng-state" in line for line in repair_notices(proc.stderr)), proc.stderr[-2000:]


def test_a_torch_only_script_recomputes_with_its_forwards_compiled_graph():
    upstream, _ = _line(["-P", "-m", "hotfix_lab.cases.compile_graph_order"], disabled=True)
    fixed, _ = _line(["-P", "-m", "hotfix_lab.cases.compile_graph_order"])
    assert upstream["installed"]["recomputation_runs_forwards_graph"] is False and not upstream["applied"], upstream
    assert fixed["hotfix_before"] is False and fixed["applied"] is True, fixed
    assert fixed["installed"]["recomputation_runs_forwards_graph"] is True, fixed
    assert fixed["upstream"]["recomputation_runs_forwards_graph"] is False, fixed  # hotfix.revert() in that process


@pytest.mark.parametrize("first", ["non-reentrant", "reentrant"])
def test_the_watches_stand_until_the_first_checkpoint_and_then_go(first):
    seen, proc = _line(["-c", WATCH_PROBE, first])
    assert seen["watched"].endswith("first_non_reentrant_checkpoint"), seen
    assert seen["watched_apply"].endswith("first_reentrant_checkpoint"), seen
    assert seen["hotfix_after_plain_step"] is False, seen  # a step without checkpointing activates nothing
    assert seen["hotfix_after_first_checkpoint"] is True, seen
    # the fixes joined torch's own generator and apply: the watches are gone from under them
    assert "torch-compile-recompute-graph" in seen["hooks"], seen
    assert seen["torch_generator_under_them"] == "_checkpoint_without_reentrant_generator", seen
    assert "torch-checkpoint-rng-state" in seen["apply_hooks"], seen
    assert seen["torch_apply_under_them"] == "Function.apply", seen  # the inherited classmethod, torch's own
    disabled, _ = _line(["-c", "import json, torch, torch.utils.checkpoint as c; print(json.dumps("
                               "{'standing': c._checkpoint_without_reentrant_generator.__qualname__, "
                               "'own_apply': 'apply' in c.CheckpointFunction.__dict__}))"], disabled=True)
    assert disabled == {"standing": "_checkpoint_without_reentrant_generator", "own_apply": False}, disabled


#: the fixes joined torch's objects as hotfix's import found them, then hotfix.revert() and one checkpointed call of
#: each kind: torch's own objects must stand after it
ORDER_PROBE = (
    "import sys; sys.argv[1] == 'hotfix' and __import__('hotfix'); "  # argv[1]: which is imported first
    "import json, torch, hotfix, torch.utils.checkpoint as c; "
    "from torch.nn.parallel import DistributedDataParallel as D; from hotfix.junction import hooks_on; "
    "name = '_checkpoint_without_reentrant_generator'; g = c.__dict__[name]; "
    "seen = {'hooks': list(hooks_on(g)), 'under': g.__wrapped__.__qualname__, "
    "'apply_hooks': list(hooks_on(c.CheckpointFunction.__dict__.get('apply'))), 'ddp_init': D.__init__.__qualname__}; "
    "seen['reverted'] = sorted(hotfix.revert()); x = torch.ones(2, requires_grad=True); "
    "[c.checkpoint(torch.sin, x, use_reentrant=mode).sum().backward() for mode in (True, False)]; "
    "seen['after'] = {'generator': c.__dict__[name].__qualname__, "
    "'own_apply': 'apply' in c.CheckpointFunction.__dict__, 'ddp_init': D.__init__.__qualname__}; "
    "print(json.dumps(seen))")


@pytest.mark.parametrize("first", ["torch", "hotfix"])
def test_import_hotfix_before_or_after_torch_the_fixes_join_torchs_own_and_a_revert_gives_them_back(first):
    """``import torch`` then ``import hotfix``: the watches are taken away before the fixes join torch's own generator
    and ``apply``, and DDP keeps its own ``__init__`` (with a watch still standing, the fixes' drift checks read the
    watch: every fix of torch's checkpoint skipped, one line each).  ``import hotfix`` then ``import torch`` (hotfix
    active before torch is there): no watch is put at all.  Until 2026-11-30 the start-up finder still watched
    torch's objects there, over the fixes' junctions: a fix or every fix reverted came back at the first checkpointed
    call (the watch's first call put back what it had found, the junction with every hook), and ``hotfix.revert()``
    left torch's checkpoint running the fixes."""
    seen, proc = _line(["-c", ORDER_PROBE, first])
    assert "skipped" not in proc.stderr, proc.stderr[-2000:]
    assert seen["under"] == "_checkpoint_without_reentrant_generator", seen
    assert {"torch-checkpoint-rng-state", "torch-compile-recompute-graph", "moe-routing-replay"} <= set(seen["hooks"])
    assert "torch-checkpoint-rng-state" in seen["apply_hooks"], seen
    assert seen["ddp_init"] == "DistributedDataParallel.__init__", seen
    assert "torch-ddp-find-unused" in seen["reverted"], seen
    assert seen["after"] == {"generator": "_checkpoint_without_reentrant_generator", "own_apply": False,
                             "ddp_init": "DistributedDataParallel.__init__"}, seen
