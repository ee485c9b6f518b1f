"""patches/llamafactory_unsloth_gc.py on a real LlamaFactory release, on CPU.

hotfix_lab.cases.fork_cases in a fresh interpreter: the release's real ``model_utils/checkpointing.py`` loaded by
fork_loader (its package stubbed), checkpointing turned on as LlamaFactory's ``prepare_model_for_training``
does, one step without checkpointing and one with, every gradient compared (1e-6).  0.9.5 (latest) with
transformers 4.56.2 (the test venv's; its pins allow it): each defect reproduces upstream (HOTFIX_DISABLE=1),
then with hotfix activated in the same process every case is equal.  LlamaFactory's wrapper reads the layer
from hotfix's wrappers of the call, this fix opted out or not.  Every release on PyPI: the stored rows
(docs/census/forks/) against the declared ranges.
"""

from __future__ import annotations

import json

from conftest import REPO, json_lines, matrix_path, repair_notices, run_python

FIX = "llamafactory-unsloth-gc"
RELEASE = "0.9.5"
BACKWARD_TWICE = "Trying to backward through the graph a second time"
ONE_GRADIENT = "takes 2 positional arguments but 3 were given"


def _cases(function, cases, then=None, env=None):
    """{(phase, case): result} of one fork_cases.py child, and the child."""
    args = ["-P", "-m", "hotfix_lab.cases.fork_cases", function, *cases]
    env = dict(env or {})
    if then is not None:
        args += ["--activate", *then]
        env["HOTFIX_DISABLE"] = "1"
    proc = run_python(args, env=env, pythonpath=[matrix_path("llamafactory", RELEASE)], timeout=300)
    results = {(r["phase"], r["case"]): r for r in json_lines(proc.stdout)}
    first = "upstream" if then is not None else "hotfix"
    expected = [(first, c) for c in cases] + [("hotfix", c) for c in then or ()]
    assert all(key in results for key in expected), proc.stdout[-2000:] + proc.stderr[-3000:]
    return results, proc


def _equal(result):
    assert result["status"] == "equal" and result["missing"] == 0 and result["wrong"] == 0, result


def test_use_unsloth_gc_broken_upstream_equal_with_hotfix():
    upstream = ["plain", "keyword", "several-outputs", "output-with-none"]
    fixed = ["plain", "tensor-output", "keyword", "keyword-frozen-first", "several-outputs", "output-with-none",
             "copy"]  # the real models of every release: the fork census
    results, proc = _cases("llamafactory-unsloth", upstream, then=fixed)
    assert results[("upstream", "header")]["release"] == RELEASE
    _equal(results[("upstream", "plain")])  # what the copy was written for works upstream
    assert BACKWARD_TWICE in results[("upstream", "keyword")]["error"]
    for case in ("several-outputs", "output-with-none"):
        assert ONE_GRADIENT in results[("upstream", case)]["error"]
    assert FIX in results[("hotfix", "header")]["applied"]
    for case in fixed[:-1]:
        _equal(results[("hotfix", case)])
    assert results[("hotfix", "copy")]["deepcopy"] == "ok"  # TRL's reference model is a deepcopy
    assert any(FIX in line for line in repair_notices(proc.stderr)), proc.stderr[-3000:]


def test_llamafactorys_wrapper_reads_the_layer_from_hotfixs_wrappers():
    """Every checkpointed call goes through LlamaFactory's wrapper, which reads the layer from the call
    (``func.__self__``).  hotfix's transformers fixes hand it their own wrapper of the call, which shows the
    layer as the call does (hotfix/checkpointing/layer_call.py; before: "AttributeError: 'FlatOutputs' object has no
    attribute '__self__'"), with this fix opted out too.  keyword, keyword-frozen-first:
    transformers-checkpoint-layer-io's repair (its lifting closure) through LlamaFactory's wrapper."""
    cases = ["plain", "keyword", "keyword-frozen-first"]
    for env in ({"HOTFIX_DISABLED_PATCHES": FIX}, None):
        results, _ = _cases("llamafactory-torch", cases, env=env)
        for case in cases:
            _equal(results[("hotfix", case)])


def test_declared_ranges_equal_the_fork_census():
    from hotfix_lab.census import forks
    from hotfix_lab.sweep import sweep_store

    rows = [json.loads(line) for line in sweep_store.read_lines(REPO / "docs" / "census" / "forks")]
    mine = [r for r in rows if r["fork"] == "llamafactory"]
    measured = {(r["release"], r["function"], r["case"], r["phase"]) for r in mine if r["verdict"] != "error"}
    for release, _ in forks.RELEASES["llamafactory"]:
        for function in forks.FUNCTIONS["llamafactory"]:
            for phase in ("upstream", "hotfix"):
                assert all((release, function, case, phase) in measured for case in forks.CASES), (release, function)
    assert [p for p in forks.gate_problems(rows) if p.startswith("llamafactory")] == []
