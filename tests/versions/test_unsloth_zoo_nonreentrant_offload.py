"""patches/unsloth_zoo_nonreentrant_offload.py on a real unsloth-zoo release and real transformers, on CPU.

tools/hotfix_lab/cases/zoo_routing.py in a fresh interpreter: transformers imported, the release loaded by
zoo_loader, unsloth's own ``patch_unsloth_smart_gradient_checkpointing()`` (``swap``), then a tiny
Llama's checkpointing enabled as a trainer does; each setup three steps, the unsloth nodes of each
loss counted, gradients against the same step without checkpointing, unsloth's offload line.
2025.11.5 (in the declared range): upstream (HOTFIX_DISABLE=1) transformers 5.23.0's default and TRL's
``use_reentrant=False`` never reach unsloth's function (the defect reproduces, or the test proves
nothing); with hotfix every layer goes through it, offloading from step 1, gradients equal, the repaired
line said; a user who never asked stays non-reentrant.  Every release of the census: the stored rows
(docs/census/zoo-nonreentrant/) against the declared ranges.
"""

from __future__ import annotations

import json

import pytest

from conftest import hotfix_lines, json_lines, matrix_path, repair_notices, run_python

FIX = "unsloth-zoo-nonreentrant-offload"
DDP_FIX = "transformers-ddp-find-unused"
RELEASE = "2025.11.5"
LAYERS = 3


def _routing(transformers, setups, env=None):
    """The setups' results of one zoo_routing.py child, in order, and the child."""
    path = [matrix_path("unsloth-zoo", RELEASE), matrix_path("transformers", transformers)]
    proc = run_python(["-P", "-m", "hotfix_lab.cases.zoo_routing", *setups], env=env, pythonpath=path, timeout=300)
    results = [r for r in json_lines(proc.stdout) if r["case"] == "setup"]
    assert [r["setup"] for r in results] == [s for s in setups if s not in ("swap", "unswap", "activate", "revert")], \
        proc.stdout[-2000:] + proc.stderr[-3000:]
    return results, proc


def _bypassed(result):
    assert "status" not in result, result
    assert [s["unsloth_nodes"] for s in result["steps"]] == [0, 0, 0], result
    assert not any(s["offload_line"] for s in result["steps"]) and FIX not in result["repaired"], result
    assert all(s["grads"] == "equal" for s in result["steps"]), result  # torch's non-reentrant checkpoint is exact


def _routed(result, offloads=True):
    assert "status" not in result, result
    assert [s["unsloth_nodes"] for s in result["steps"]] == [LAYERS] * 3, result  # every layer, every step
    assert all(s["grads"] == "equal" for s in result["steps"]), result
    if offloads:  # hotfix's offloader (unsloth-zoo-offload-backward): every layer in step 1, the last kept after
        assert result["steps"][0]["offload_line"] and [s["offloaded"] for s in result["steps"]] == [3, 2, 2], result


def test_transformers_5_default_and_trl_kwargs_reach_unsloths_function_only_with_hotfix():
    setups = ["trl", "swap", "default", "trl", "unswap", "activate", "trl", "swap", "default", "trl", "ddp",
              "revert", "default"]
    results, proc = _routing("5.23.0", setups, env={"HOTFIX_DISABLE": "1"})
    upstream_not_asked, upstream_default, upstream_trl, not_asked, default, trl, ddp, reverted = results
    assert [r["hotfix"] for r in results] == [False] * 3 + [True] * 4 + [False]
    for result in (upstream_not_asked, upstream_default, upstream_trl):  # upstream: bypassed, no offload
        _bypassed(result)
    _bypassed(not_asked)  # with hotfix, never asked for unsloth's offload: non-reentrant as chosen
    for result in (default, trl):
        _routed(result)
        assert FIX in result["repaired"]
    # DDP(find_unused_parameters=True), TRL's kwargs: routed, and the DDP fix makes reentrant correct there
    _routed(ddp)
    assert {FIX, DDP_FIX} <= set(ddp["repaired"])
    _bypassed(reverted)  # hotfix.revert(): the bypass is back
    notices = [line for line in repair_notices(proc.stderr) if FIX in line]
    assert len(notices) == 1 and "use_reentrant=False bypassed" in notices[0], proc.stderr[-3000:]
    assert not hotfix_lines(proc.stderr), proc.stderr[-3000:]


def test_transformers_4_with_trl_kwargs_reaches_it_hotfix_activated_first():
    """The start-up hook's order (hotfix before the release); 4.x's default is reentrant: unsloth's own path."""
    (not_asked, default, trl), proc = _routing("4.56.2", ["trl", "swap", "default", "trl"])
    _bypassed(not_asked)
    _routed(default)
    assert FIX not in default["repaired"]  # nothing was bypassed there
    _routed(trl)
    assert FIX in trl["repaired"]


def test_under_ddp_without_the_ddp_fix_the_call_stays_non_reentrant():
    """Reentrant checkpointing under DDP(find_unused_parameters=True) fails ("mark a variable ready only
    once") without transformers-ddp-find-unused: with it opted out, routing would crash the step."""
    (ddp, trl), proc = _routing("5.23.0", ["swap", "ddp", "trl"], env={"HOTFIX_DISABLED_PATCHES": DDP_FIX})
    _bypassed(ddp)
    _routed(trl)  # outside DDP the same process routes
    warnings = hotfix_lines(proc.stderr)
    assert len(warnings) == 1 and "stays bypassed under DistributedDataParallel" in warnings[0], proc.stderr[-3000:]


def test_census_rows_hold_the_declared_ranges():
    """Every census release under both transformers lines, and the fix's ranges equal to what they measure."""
    from hotfix_lab.census import releases
    from hotfix_lab.sweep import sweep_store
    from hotfix_lab.census import zoo_nonreentrant

    from hotfix.patches.unsloth_zoo_nonreentrant_offload import patch

    rows = [json.loads(line) for line in sweep_store.read_lines(zoo_nonreentrant.STORE)]
    if not rows:
        pytest.skip("no census rows yet: python -P -m hotfix_lab.census.zoo_nonreentrant")
    measured = {(r["release"], r["transformers"]) for r in rows if r["verdict"] != "error"}
    missing = [(zoo, t) for zoo, _ in releases.zoo_releases() for t in zoo_nonreentrant.TRANSFORMERS
               if (zoo, t) not in measured]
    assert not missing, f"{len(missing)} (release, transformers) pairs not measured, e.g. {missing[:3]}"
    assert zoo_nonreentrant.gate_problems(rows, patch) == []
