"""patches/axolotl_offload_checkpoint.py on real axolotl releases, on CPU.

tools/hotfix_lab/cases/fork_cases.py in a fresh interpreter: the release's real ``monkeypatch/gradient_checkpointing/``
loaded by fork_loader (its package stubbed), its wrapper set as ``transformers.modeling_utils.checkpoint`` as
axolotl does (``gradient_checkpointing: offload``, ``offload_disk``), one step without checkpointing and one
with, every gradient compared (1e-6).  0.21.0 (latest; it asks Python >= 3.12, its checkpointing files run on 3.11)
and 0.14.0 (the last whose host copy unpacks ``(output,) = ...``) with transformers 5.0.0 (0.14.0's pin; 0.21.0 pins
5.20.1, whose layers call the checkpoint as 5.0.0's do: the fork census runs each release on its pin, where 5.23.0's
no longer show axolotl's wrapper a bound layer call): each defect reproduces
upstream (HOTFIX_DISABLE=1), then with hotfix activated in the same process every case is equal.  Hotfix with
this fix opted out leaves axolotl's wrapper as upstream has it; axolotl's module importing transformers first
gets the fix once its import finished.  Every release on PyPI: the stored rows (docs/census/forks/)
against the declared ranges.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO, json_lines, matrix_path, repair_notices, run_python

FIX = "axolotl-offload-checkpoint"
#: release -> the transformers it runs with (in tests/matrix.txt)
RELEASES = {"0.21.0": "5.0.0", "0.14.0": "5.0.0"}
BACKWARD_TWICE = "Trying to backward through the graph a second time"


def _cases(release, function, cases, then=None, env=None):
    """{(phase, case): result} of one fork_cases.py child, and the child."""
    args = ["-P", "-m", "hotfix_lab.cases.fork_cases", function, *cases]
    env = dict(env or {})
    if then is not None:
        args += ["--activate", *then]
        env["HOTFIX_DISABLE"] = "1"
    path = [matrix_path("axolotl", release), matrix_path("transformers", RELEASES[release])]
    proc = run_python(args, env=env, pythonpath=path, timeout=300)
    results = {(r["phase"], r["case"]): r for r in json_lines(proc.stdout)}
    first = "upstream" if then is not None else "hotfix"
    expected = [(first, c) for c in cases] + [("hotfix", c) for c in then or ()]
    assert all(key in results for key in expected), proc.stdout[-2000:] + proc.stderr[-3000:]
    return results, proc


def _equal(result):
    assert result["status"] == "equal" and result["missing"] == 0 and result["wrong"] == 0, result


FIXED = ["plain", "tensor-output", "keyword", "keyword-frozen-first", "several-outputs", "output-with-none", "copy"]


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_offload_broken_upstream_equal_with_hotfix(release):
    upstream = ["plain", "tensor-output", "keyword", "several-outputs"]
    results, proc = _cases(release, "axolotl-offload", upstream, then=FIXED)
    assert results[("upstream", "header")]["release"] == release
    _equal(results[("upstream", "plain")])  # what the copy was written for works upstream
    assert BACKWARD_TWICE in results[("upstream", "keyword")]["error"]
    assert "takes 2 positional arguments but 3 were given" in results[("upstream", "several-outputs")]["error"]
    if release == "0.14.0":  # a layer returning a tensor (every decoder layer on 5.0.0): fixed upstream in 0.15.0
        assert "too many values to unpack" in results[("upstream", "tensor-output")]["error"]
    else:
        _equal(results[("upstream", "tensor-output")])
    assert FIX in results[("hotfix", "header")]["applied"]
    for case in FIXED[:-1]:
        _equal(results[("hotfix", case)])
    assert results[("hotfix", "copy")] == dict(results[("hotfix", "copy")], deepcopy="ok", pickle="ok")
    assert any(FIX in line for line in repair_notices(proc.stderr)), proc.stderr[-3000:]


def test_offload_disk_broken_upstream_equal_with_hotfix():
    results, _ = _cases("0.21.0", "axolotl-offload-disk", ["plain", "keyword", "output-with-none"],
                        then=["keyword", "output-with-none", "several-outputs"])
    _equal(results[("upstream", "plain")])
    assert BACKWARD_TWICE in results[("upstream", "keyword")]["error"]
    assert results[("upstream", "output-with-none")]["status"] == "crash"  # a None among the outputs
    for case in ("keyword", "output-with-none", "several-outputs"):
        _equal(results[("hotfix", case)])


def test_hotfix_without_this_fix_leaves_axolotls_wrapper_as_upstream():
    """This fix opted out: hotfix's transformers fixes step aside for axolotl's own wrapper (hotfix.relations), so
    every case runs as upstream does: what the copy was written for trains equal, the keyword case fails as it
    does upstream.  It crashed every run before ("'FlatOutputs' object has no attribute 'func'")."""
    results, proc = _cases("0.21.0", "axolotl-offload", ["plain", "keyword"], env={"HOTFIX_DISABLED_PATCHES": FIX})
    _equal(results[("hotfix", "plain")])
    assert BACKWARD_TWICE in results[("hotfix", "keyword")]["error"]
    assert "has no attribute 'func'" not in proc.stdout + proc.stderr


#: a process whose first import of transformers is axolotl's checkpointing module (its body imports it): the
#: start-up hook activates hotfix there, while that module is half made
AXOLOTL_FIRST = """
import json, sys
from hotfix_lab.infra import fork_loader
module = fork_loader.load("axolotl")
import hotfix
from hotfix_lab.cases import fork_cases
patch = hotfix.known_patches()["axolotl-offload-checkpoint"]
enable, _ = fork_loader.enabler("axolotl-offload", module)
print(json.dumps({"applied": list(patch.applied_targets), "error": patch.last_error,
                  "plain": fork_cases.run_case("plain", enable)["status"],
                  "keyword": fork_cases.run_case("keyword", enable)["status"]}))
"""


def test_axolotls_module_importing_transformers_first_gets_this_fix_once_its_import_finished():
    """axolotl's checkpointing module is the first of the process to import transformers: the start-up hook
    activates hotfix while that module is half made.  The fix used to be applied right then ("skipped: ... none
    of hf_grad_checkpoint_offload_wrapper, ... is there") and every run crashed.  Now it waits for that import to
    finish: applied, every case equal."""
    path = [matrix_path("axolotl", "0.21.0"), matrix_path("transformers", RELEASES["0.21.0"])]
    proc = run_python(["-c", AXOLOTL_FIRST], pythonpath=path, timeout=300)
    found = json_lines(proc.stdout)
    assert found == [{"applied": ["axolotl.monkeypatch.gradient_checkpointing"], "error": None, "plain": "equal",
                      "keyword": "equal"}], proc.stdout[-2000:] + proc.stderr[-3000:]


def test_declared_ranges_equal_the_fork_census():
    from hotfix_lab.census import forks
    from hotfix_lab.sweep import sweep_store

    rows = [json.loads(line) for line in sweep_store.read_lines(REPO / "docs" / "census" / "forks")]
    mine = [r for r in rows if r["fork"] == "axolotl"]
    measured = {(r["release"], r["function"], r["case"], r["phase"]) for r in mine if r["verdict"] != "error"}
    for release, _ in forks.RELEASES["axolotl"]:
        for function in forks.FUNCTIONS["axolotl"]:
            for phase in ("upstream", "hotfix"):
                assert all((release, function, case, phase) in measured for case in forks.CASES), (release, function)
    assert [p for p in forks.gate_problems(rows) if p.startswith("axolotl")] == []
