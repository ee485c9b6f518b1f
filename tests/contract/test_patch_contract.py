"""One contract, checked the same way for every registered fix (dd-trace's PatchTestCase idea).

For each patch that ``hotfix.known_patches()`` discovers through the entry-point
group, in a fresh interpreter, with its target imported before or after
``import hotfix``:

* it is applied exactly once to each target, and applying / activating again
  changes nothing;
* ``revert()`` leaves every object it could have touched ``is``-identical to
  what was there before hotfix came (the target module's namespace, the
  ``__dict__`` of every class defined there, ``torch.nn.Module`` and, for the
  transformers targets, ``GradientCheckpointingLayer``);
* on a target whose shape drifted (an empty module of the same name) ``drift``
  returns a reason, ``apply`` returns False and logs exactly one line.

A new fix registered in pyproject.toml is picked up here with no edit.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import FINDER, TESTS, WATCH, json_lines, matrix_path, run_python

CHILD = r"""
import importlib, inspect, io, json, logging, sys, types
name, order = sys.argv[1], sys.argv[2]
# Take the start-up hook out: "before" must really import the target before hotfix.
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ not in STARTUP_FINDERS]
ZOO = "unsloth_zoo.gradient_checkpointing"

def import_targets(targets):
    for target in targets:
        if target == ZOO:
            from hotfix_lab.infra import zoo_loader
            zoo_loader.install_stubs(zoo_loader.zoo_dir())
        if target.startswith("unsloth_zoo.temporary_patches."):  # its package's __init__ needs a GPU: a bare one
            from hotfix_lab.infra import zoo_loader
            zoo_loader.load_temporary_patch(target.rsplit(".", 1)[1])
        if target.split(".")[0] in ("llamafactory", "axolotl"):
            from hotfix_lab.infra import fork_loader  # the fork's package stubbed; imports the release's one checkpointing module
            assert fork_loader.load(target.split(".")[0]).__name__ == target
        importlib.import_module(target)

def touched_objects(targets):
    # Everything a fix of these targets may change, by identity.
    import torch
    owners = [torch.nn.Module]
    for target in targets:
        module = sys.modules[target]
        owners.append(module)
        owners += [v for v in vars(module).values() if inspect.isclass(v) and v.__module__ == target]
    if any(t.startswith("transformers") for t in targets):
        import transformers.modeling_layers as ml, transformers.modeling_utils as mu
        owners += [ml.GradientCheckpointingLayer, mu.PreTrainedModel]
    return {f"{getattr(o, '__name__', o)}.{k}": id(v) for o in owners for k, v in list(vars(o).items())}

targets = sys.argv[3].split(",")
if order == "before":
    import_targets(targets)
    snapshot = touched_objects(targets)
import hotfix
from hotfix.registry import registry
stream = io.StringIO()
handler = logging.StreamHandler(stream)
logging.getLogger("hotfix").addHandler(handler)
if order == "after":
    import_targets(targets)
patch = hotfix.known_patches()[name]
out = {"applied": list(patch.applied_targets), "undo": len(patch.ledger)}
out["apply_again"] = [patch.apply(sys.modules[t]) for t in targets]
out["activate_again"] = hotfix.activate()
out["applied_after_again"] = list(patch.applied_targets)
out["undo_after_again"] = len(patch.ledger)
hotfix.revert()
if order == "before":
    after = touched_objects(targets)
    out["changed_after_revert"] = sorted(k for k in set(snapshot) | set(after) if snapshot.get(k) != after.get(k))
fresh = type(patch)()
drifted = types.ModuleType(targets[0])
out["drift_reason"] = fresh.drift(drifted)
stream.truncate(0); stream.seek(0)
out["apply_drifted"] = fresh.apply(drifted)
out["drift_lines"] = [l for l in stream.getvalue().splitlines() if l.strip()]
print(json.dumps(out))
""".replace("STARTUP_FINDERS", repr((WATCH, FINDER)))


#: a fork's release in the matrix, for the fixes of its checkpointer; a release holds one of the fix's
#: alternative targets (the module moved between releases): the first, today's layout
FORKS = {"llamafactory": "0.9.5", "axolotl": "0.21.0"}
#: a release in a fix's range of a distribution the test venv lacks (gated on it, the fix applies only beside it)
BESIDE = {"deepspeed": "0.19.2"}


def _patches():
    from hotfix.registry import registry

    return sorted((name, patch.targets[:1] if patch.targets[0].split(".")[0] in FORKS else patch.targets)
                  for name, patch in registry.patches().items())


def _pythonpath(name, targets):
    from hotfix.registry import registry

    # a distribution the fix is gated on, or one of its targets' (moe-routing-replay reaches DeepSpeed's function)
    wanted = set(registry.patches()[name].distributions) | {target.split(".")[0] for target in targets}
    paths = [matrix_path(dist, BESIDE[dist]) for dist in BESIDE if dist in wanted]
    if any(t.startswith("unsloth_zoo") for t in targets):
        # in range for both zoo fixes; moe-routing-replay's fused router gate is 2026.10.8's and later
        fused = any(t.startswith("unsloth_zoo.temporary_patches.") for t in targets)
        paths += [matrix_path("unsloth-zoo", "2026.10.9" if fused else "2025.11.3"), TESTS]
    fork = targets[0].split(".")[0]
    if fork in FORKS:
        paths.append(matrix_path(fork, FORKS[fork]))
    return paths


def _run(name, targets, order):
    proc = run_python(["-c", CHILD, name, order, ",".join(targets)], env={"OMP_NUM_THREADS": "1"},
                      pythonpath=_pythonpath(name, targets), timeout=300)
    lines = json_lines(proc.stdout)
    assert lines, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("name, targets", _patches())
def test_every_registered_fix_follows_the_contract(name, targets):
    with ThreadPoolExecutor(2) as pool:
        before, after = pool.map(lambda order: _run(name, targets, order), ("before", "after"))
    for seen in (before, after):
        assert seen["applied"] == list(targets), seen
        assert seen["apply_again"] == [True] * len(targets) and seen["activate_again"] is True, seen
        assert seen["applied_after_again"] == list(targets) and seen["undo_after_again"] == seen["undo"], seen
        assert isinstance(seen["drift_reason"], str) and seen["drift_reason"], seen
        assert seen["apply_drifted"] is False, seen
        assert len(seen["drift_lines"]) == 1 and name in seen["drift_lines"][0] and "skipped" in seen["drift_lines"][0], seen
    assert before["changed_after_revert"] == [], before


# --------------------------------------------------------------------------------------------
# The declarations every built-in fix carries, read without importing torch or its target.
def _builtin_fixes():
    import hotfix

    return [p for key, p in sorted(hotfix.known_patches().items())
            if hotfix.registry.sources.get(key) == "hotfix-checkpoint"]


def _pyproject_fixes():
    """The names in pyproject's entry-point table (the one declaration of the built-in fixes)."""
    import re

    from conftest import REPO

    table = (REPO / "pyproject.toml").read_text().split('[project.entry-points."hotfix.patches"]', 1)[1]
    table = table.split("\n[", 1)[0]
    return re.findall(r"^([a-z0-9-]+)\s*=", table, flags=re.M)


def test_every_builtin_fix_declares_its_mechanisms_docs_and_a_short_docstring():
    """Mechanisms with valid ranges (the census checks them against measurements), a
    "What breaks / How this fixes it" module docstring of at most 15 lines, and a docs page."""
    import sys

    from packaging.specifiers import SpecifierSet

    from conftest import REPO

    fixes = _builtin_fixes()
    assert sorted(p.name for p in fixes) == sorted(_pyproject_fixes()), [p.name for p in fixes]
    for patch in fixes:
        assert patch.mechanisms and patch.symptom and patch.upstream, patch.name
        assert len({m.name for m in patch.mechanisms}) == len(patch.mechanisms), patch.name
        for mechanism in patch.mechanisms:
            assert mechanism.summary and mechanism.affected, (patch.name, mechanism)
            for spec in mechanism.affected.values():
                SpecifierSet(spec)  # raises on an invalid range
        doc = sys.modules[type(patch).__module__].__doc__
        assert "What breaks" in doc and "How this fixes it" in doc, patch.name
        assert len(doc.strip().splitlines()) <= 15, (patch.name, len(doc.strip().splitlines()))
        assert (REPO / "docs" / "fixes" / f"{patch.name}.md").is_file(), patch.name
