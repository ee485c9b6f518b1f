"""Under ``torch.compile`` hotfix stays out of dynamo's way.

Dynamo traces ``torch.utils.checkpoint`` as its own higher-order op, which
tracks closure tensors and parameters itself: compiled reentrant
checkpointing trains correctly without hotfix (4.56.2).  hotfix's wrapper
used to be a graph break there ("Dynamo does not know how to trace the
function FunctionWrapper"; 11 graphs instead of 5, recompiles on guards of
tensor ids).  The class-level slots (``hotfix.checkpointing.slot``) now hand
dynamo the raw function every module holds (another torch line: tests/versions/test_torch_lines.py).

One child per (backend, model, hotfix on/off): tools/hotfix_lab/cases/compile_case.py, two compiled
training steps, counting dynamo's graphs, graph breaks, compiled frames and recompiles,
and comparing gradients with an uncompiled step without checkpointing.  The upstream children
are recorded (tests/evidence/torch-compile.json, support/evidence.py): their verdict and counts.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version as installed

import pytest

from conftest import TRANSFORMERS_WARM, json_lines, run_python
from support import evidence

#: what an upstream child is made of (support/evidence.py adds the lab's infrastructure and the comparison rule)
GUARDS = ("tools/hotfix_lab/cases/compile_case.py", "tests/e2e/test_torch_compile.py")
#: what the tests read of a child, all of it counts and verdicts
FACTS = ("hotfix", "status", "graphs", "breaks", "frames", "recompiles")


def _run(backend, model, disabled):
    env = {"OMP_NUM_THREADS": "1"}
    if disabled:
        env["HOTFIX_DISABLE"] = "1"
    proc = run_python(["-P", "-m", "hotfix_lab.cases.compile_case", "--model", model, "--backend", backend], env=env,
                      timeout=500, warm=TRANSFORMERS_WARM)
    lines = json_lines(proc.stdout)
    assert lines, proc.stderr[-3000:]
    return lines[-1]


def _upstream(backend, model):
    """The child without hotfix, recorded."""
    parts = {"backend": backend, "model": model, "torch": installed("torch"), "transformers": installed("transformers")}
    return evidence.upstream("torch-compile", f"{backend}:{model}", parts, GUARDS, lambda: _run(backend, model, True),
                             lambda result: {key: result.get(key) for key in FACTS})


@pytest.mark.parametrize("model", ["whisper", "whisper-qv"])  # whisper-qv: frozen-inputs' case (LoRA-like)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_reentrant_checkpointing_same_graphs_with_and_without_hotfix(backend, model):
    with ThreadPoolExecutor(2) as pool:
        without, with_hotfix = pool.submit(_upstream, backend, model), pool.submit(_run, backend, model, False)
        without, with_hotfix = without.result(), with_hotfix.result()
    assert without["hotfix"] is False and with_hotfix["hotfix"] is True
    assert without["status"] == "equal", without  # compiled: correct upstream already
    assert with_hotfix["status"] == "equal", with_hotfix
    assert with_hotfix["hotfix_in_breaks"] is False, with_hotfix
    for key in ("graphs", "breaks", "frames", "recompiles"):  # frames, recompiles: no recompilation caused by hotfix
        assert with_hotfix[key] == without[key], (key, without, with_hotfix)
