"""A torch-only script's first non-reentrant checkpoint activates hotfix: installed, no `import hotfix`, no DDP.

torchtitan- and torchtune-style training imports torch and no trigger (transformers, unsloth) and often builds no DDP
(FSDP2, one device); its checkpoint is torch's non-reentrant one, with ``preserve_rng_state=False`` and compiled
submodules: torch-checkpoint-rng-state's and torch-compile-recompute-graph's cases.  Until 2026-11-30 hotfix stayed
off in such a process.  Now the start-up hook also watches the generator every non-reentrant checkpoint call runs
(a plain function in torch's module, no import): its first call activates hotfix and runs through the fixes.

Each case a fresh interpreter of the test venv, hotfix installed, upstream with ``HOTFIX_DISABLE=1``: two blocks
with dropout under ``checkpoint(..., use_reentrant=False, preserve_rng_state=False)`` against the step without
checkpointing (upstream wrong, with hotfix equal and one "repaired" line); tools/lab/compile_graph_order.py (the
recomputation runs the graph compiled last upstream, its forward's with hotfix); and the watch itself (torch's own
generator back once hotfix is active; a reentrant call and a plain step activate nothing).
"""

from __future__ import annotations

from conftest import LAB, json_lines, repair_notices, run_python

DROPOUT_SCRIPT = r"""
import functools, json, sys
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

def step(function):
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 8))
                            for _ in range(2)])
    torch.manual_seed(1)
    x = torch.randn(4, 8)
    for block in blocks:
        x = x + (function(block, x) if function else block(x))
    x.pow(2).sum().backward()
    return [p.grad for p in blocks.parameters()]

before = "hotfix" in sys.modules
reference = step(None)
after_plain = "hotfix" in sys.modules
got = step(functools.partial(checkpoint, use_reentrant=False, preserve_rng_state=False))
print(json.dumps({"hotfix_before": before, "hotfix_after_plain_step": after_plain,
                  "hotfix_after": "hotfix" in sys.modules,
                  "equal": [g is not None and torch.allclose(r, g, rtol=1e-5, atol=1e-7)
                            for r, g in zip(reference, got)]}))
"""

WATCH_PROBE = r"""
import json, sys, torch
import torch.utils.checkpoint as c
name = "_checkpoint_without_reentrant_generator"
seen = {"watched": c.__dict__[name].__qualname__}
layer, x = torch.nn.Linear(2, 2), torch.randn(1, 2, requires_grad=True)
c.checkpoint(layer, x, use_reentrant=True).sum().backward()
seen["hotfix_after_reentrant"] = "hotfix" in sys.modules
c.checkpoint(layer, x, use_reentrant=False).sum().backward()
seen["hotfix_after_non_reentrant"] = "hotfix" in sys.modules
from hotfix.junction import hooks_on
standing = c.__dict__[name]
seen["hooks"] = list(hooks_on(standing))
seen["torch_generator_under_them"] = getattr(standing, "__wrapped__", None).__qualname__
print(json.dumps(seen))
"""


def _line(args, disabled=False):
    proc = run_python(args, env={"HOTFIX_DISABLE": "1"} if disabled else None, timeout=300)
    lines = json_lines(proc.stdout)
    assert lines, proc.stderr[-3000:]
    return lines[-1], proc


def test_a_torch_only_script_with_preserve_rng_state_false_trains_equal_with_hotfix_installed():
    upstream, _ = _line(["-c", DROPOUT_SCRIPT], disabled=True)
    fixed, proc = _line(["-c", DROPOUT_SCRIPT])
    assert not all(upstream["equal"]) and upstream["hotfix_after"] is False, upstream
    assert fixed["hotfix_before"] is False and fixed["hotfix_after_plain_step"] is False, fixed
    assert fixed["hotfix_after"] is True and all(fixed["equal"]), fixed
    assert any("torch-checkpoint-rng-state" in line for line in repair_notices(proc.stderr)), proc.stderr[-2000:]


def test_a_torch_only_script_recomputes_with_its_forwards_compiled_graph():
    upstream, _ = _line([str(LAB / "compile_graph_order.py")], disabled=True)
    fixed, _ = _line([str(LAB / "compile_graph_order.py")])
    assert upstream["installed"]["recomputation_runs_forwards_graph"] is False and not upstream["applied"], upstream
    assert fixed["hotfix_before"] is False and fixed["applied"] is True, fixed
    assert fixed["installed"]["recomputation_runs_forwards_graph"] is True, fixed
    assert fixed["upstream"]["recomputation_runs_forwards_graph"] is False, fixed  # hotfix.revert() in that process


def test_the_watch_stands_until_the_first_non_reentrant_checkpoint_and_then_goes():
    seen, proc = _line(["-c", WATCH_PROBE])
    assert seen["watched"].endswith("first_non_reentrant_checkpoint"), seen
    assert seen["hotfix_after_reentrant"] is False, seen  # a reentrant call under no DDP activates nothing
    assert seen["hotfix_after_non_reentrant"] is True, seen
    # the fixes joined torch's own generator: the watch is gone from under them
    assert "torch-compile-recompute-graph" in seen["hooks"], seen
    assert seen["torch_generator_under_them"] == "_checkpoint_without_reentrant_generator", seen
    disabled, _ = _line(["-c", "import json, torch, torch.utils.checkpoint as c; print(json.dumps("
                               "{'standing': c._checkpoint_without_reentrant_generator.__qualname__}))"], disabled=True)
    assert disabled["standing"] == "_checkpoint_without_reentrant_generator", disabled  # HOTFIX_DISABLE: no watch


def test_import_hotfix_after_torch_takes_the_watches_away_before_the_fixes_attach():
    """``import torch`` then ``import hotfix``: the fixes join torch's own generator and DDP keeps its own
    ``__init__`` (with the watch still standing, the fixes' drift checks read the watch: every fix of torch's
    checkpoint skipped, one line each)."""
    probe = ("import json, torch, hotfix, torch.utils.checkpoint as c; "
             "from torch.nn.parallel import DistributedDataParallel as D; from hotfix.junction import hooks_on; "
             "g = c.__dict__['_checkpoint_without_reentrant_generator']; "
             "print(json.dumps({'hooks': list(hooks_on(g)), 'under': g.__wrapped__.__qualname__, "
             "'ddp_init': D.__init__.__qualname__}))")
    seen, proc = _line(["-c", probe])
    assert "skipped" not in proc.stderr, proc.stderr[-2000:]
    assert seen["under"] == "_checkpoint_without_reentrant_generator", seen
    assert {"torch-checkpoint-rng-state", "torch-compile-recompute-graph", "moe-routing-replay"} <= set(seen["hooks"])
    assert seen["ddp_init"] == "DistributedDataParallel.__init__", seen
