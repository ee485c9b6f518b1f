"""hotfix on other torch lines than the test venv's: torch.compile over reentrant checkpointing on torch 2.11 and 2.7.

Two crashes with hotfix active where upstream trains, both in the checkpoint slot
(hotfix/checkpointing/slot.py), torch's and unsloth's checkpoint function alike:

* torch 2.11: ``InternalTorchDynamoError: RecursionError`` in the slot's ``__get__``: that dynamo
  answers ``instance.__dict__[name]`` by reading the attribute ``name``, through the slot again.
* torch 2.7 (2.4 - 2.8 alike): ``AssertionError: Guard check failed: ___check_type_id(
  self._gradient_checkpointing_func, ...)``: that dynamo does not call a data descriptor's
  ``__get__``; it took the slot object itself for the function, and its guard (which reads the
  instance ``__dict__``) then failed on the frame it was compiled for.

Here hotfix_lab.cases.compile_case runs a tiny Whisper and a tiny Llama under ``torch.compile(backend="eager")``
in the side venvs scripts/test.sh installs (.matrix/torch-<version>, hotfix from the same wheel,
transformers 4.56.2 and unsloth-zoo 2026.10.9 from .matrix/), without (recorded: tests/evidence/torch-lines.json,
support/evidence.py) and with hotfix: both train,
every gradient equal to an uncompiled step without checkpointing, and dynamo compiles the same
number of graphs and frames, with no recompilation in step 2.  Then the same with a second model of
the type checkpointing beside it (the slot has no one function to hand dynamo there).  The census
(tools/hotfix_lab/census/census.py, docs/versions.md) measures the other torch lines.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import TRANSFORMERS_WARM, json_lines, matrix_path, run_python
from support import evidence

TORCH_LINES = ("2.11.0", "2.7.1")  # scripts/test.sh installs each
pytestmark = pytest.mark.side_torch  # scripts/test.sh runs these after the side torches are installed
TRANSFORMERS = "4.56.2"
UNSLOTH_ZOO = "2026.10.9"
#: what an upstream child is made of (support/evidence.py adds the lab's infrastructure and the comparison rule)
GUARDS = ("tools/hotfix_lab/cases/compile_case.py", "tests/versions/test_torch_lines.py")
#: what the tests read of an upstream child: its verdict and dynamo's counts
FACTS = ("torch", "hotfix", "status", "graphs", "breaks", "frames", "recompiles")


def _compile_case(torch, model, function, hotfix, *extra):
    python = str(matrix_path("torch", torch) / "bin" / "python")
    paths = [matrix_path("transformers", TRANSFORMERS)]
    if function == "unsloth":
        paths.append(matrix_path("unsloth-zoo", UNSLOTH_ZOO))
    env = {"OMP_NUM_THREADS": "1"}
    if not hotfix:
        env["HOTFIX_DISABLE"] = "1"
    proc = run_python(["-P", "-m", "hotfix_lab.cases.compile_case", "--model", model, "--backend", "eager",
                       "--function", function, *extra], env=env, pythonpath=paths, python=python, timeout=300,
                      warm=TRANSFORMERS_WARM)
    lines = json_lines(proc.stdout)
    assert lines, proc.stderr[-3000:]
    out = lines[-1]
    assert out["torch"] == torch and out["hotfix"] is hotfix, out
    return out


def _upstream(torch, model, function):
    """The side line's child without hotfix, recorded (tests/evidence/torch-lines.json)."""
    parts = {"torch": torch, "model": model, "function": function, "transformers": TRANSFORMERS,
             "unsloth_zoo": UNSLOTH_ZOO if function == "unsloth" else None}
    return evidence.upstream("torch-lines", f"{torch}:{model}:{function}", parts, GUARDS,
                             lambda: _compile_case(torch, model, function, False),
                             lambda result: {key: result.get(key) for key in FACTS})


@pytest.mark.parametrize("torch", TORCH_LINES)
@pytest.mark.parametrize("model,function", [("whisper", "torch"), ("whisper", "unsloth"), ("llama", "torch")])
def test_compiled_reentrant_checkpointing_trains_as_without_hotfix(torch, model, function):
    with ThreadPoolExecutor(2) as pool:
        without = pool.submit(_upstream, torch, model, function)
        with_hotfix = pool.submit(_compile_case, torch, model, function, True)
        without, with_hotfix = without.result(), with_hotfix.result()
    assert without["status"] == "equal", without  # compiled: upstream trains with equal gradients
    assert with_hotfix["status"] == "equal", with_hotfix  # was: crash (2.11 RecursionError, 2.7 guard check)
    assert [step["missing"] for step in with_hotfix["steps"]] == [0, 0], with_hotfix
    for key in ("graphs", "breaks", "frames", "recompiles"):
        assert with_hotfix[key] == without[key], (key, without, with_hotfix)
    assert with_hotfix["recompiles"] == 0, with_hotfix


@pytest.mark.parametrize("torch", TORCH_LINES)
def test_compiled_model_beside_another_checkpointing_model_trains_with_equal_gradients(torch):
    """Two models' layers hold two checkpoint functions: the slot hands dynamo each layer's own.  Before
    torch 2.13 dynamo cannot read it without a graph break, so there it compiles more frames than upstream
    (docs/versions.md says so); what must hold is that it trains with every gradient equal, and that a
    steady loop compiles nothing new."""
    out = _compile_case(torch, "llama", "torch", True, "--second-model", "same")  # reentrant, as the first
    assert out.get("second_model") == "same", out
    assert out["status"] == "equal", out  # 2.7 before the property slot: crash (guard check)
    assert [step["missing"] for step in out["steps"]] == [0, 0], out
    assert out["recompiles"] == 0, out  # hotfix's own frames are never compiled on their own (2.7: they were)


@pytest.mark.parametrize("torch", TORCH_LINES)
def test_a_compiled_functions_recomputation_runs_its_forwards_graph_from_torch_2_10(torch):
    """torch-compile-recompute-graph on the side lines (hotfix_lab.cases.compile_graph_order: a backend numbering its
    graphs, two non-reentrant checkpointed calls with 3 and 5 rows).  Every line has the mechanism; from 2.10 the fix
    applies (Dynamo's switch) and the first call's recomputation runs its forward's graph; before it the fix is not
    applied (declared not reached: `hotfix status` says NOT COVERED) and the recomputation runs the graph compiled
    last, as upstream."""
    python = str(matrix_path("torch", torch) / "bin" / "python")
    proc = run_python(["-P", "-m", "hotfix_lab.cases.compile_graph_order"], env={"OMP_NUM_THREADS": "1"}, python=python,
                      timeout=300, warm=("torch",))
    lines = json_lines(proc.stdout)
    assert lines, proc.stderr[-3000:]
    out = lines[-1]
    assert out["torch"] == torch and out["hotfix_before"] is False, out
    # hotfix, installed, active from the first non-reentrant checkpoint (2.7's `import torch` does not import torch's
    # checkpoint module: watched once it is imported)
    assert "upstream" in out, out
    assert out["upstream"]["recomputation_runs_forwards_graph"] is False, out  # the mechanism, after hotfix.revert()
    reached = tuple(int(part) for part in torch.split(".")[:2]) >= (2, 10)
    assert out["applied"] is reached, out
    assert out["installed"]["recomputation_runs_forwards_graph"] is reached, out
