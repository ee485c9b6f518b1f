"""hotfix on another torch line than the test venv's: torch.compile over reentrant checkpointing on torch 2.11.

On torch 2.11 a compiled model with reentrant checkpointing crashed with hotfix active
(``InternalTorchDynamoError: RecursionError`` in the checkpoint slot's ``__get__``, torch's and
unsloth's checkpoint function alike) and trained without it: that dynamo answers
``instance.__dict__[name]`` by reading the attribute ``name``, through the slot again
(patches/_checkpoint_slot.py).  Here tools/lab/compile_case.py runs a tiny Whisper under
``torch.compile(backend="eager")`` in the side venv scripts/test.sh installs (.matrix/torch-2.11.0,
hotfix from the same wheel, transformers 4.56.2 and unsloth-zoo 2026.10.9 from .matrix/), without and
with hotfix: both train, every gradient equal to an uncompiled step without checkpointing, and dynamo
compiles the same number of graphs and frames, with no recompilation in step 2.  The census
(tools/census/census.py, docs/versions.md) measures the other torch lines.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import LAB, json_lines, matrix_path, run_python

TORCH = "2.11.0"
TRANSFORMERS = "4.56.2"
UNSLOTH_ZOO = "2026.10.9"


def _compile_case(python, paths, function, hotfix):
    env = {"OMP_NUM_THREADS": "1"}
    if not hotfix:
        env["HOTFIX_DISABLE"] = "1"
    proc = run_python([str(LAB / "compile_case.py"), "--model", "whisper", "--backend", "eager",
                       "--function", function], env=env, pythonpath=paths, python=python, timeout=300)
    lines = json_lines(proc.stdout)
    assert lines, proc.stderr[-3000:]
    return lines[-1]


@pytest.mark.parametrize("function", ["torch", "unsloth"])
def test_compiled_reentrant_checkpointing_trains_on_torch_2_11_as_without_hotfix(function):
    python = str(matrix_path("torch", TORCH) / "bin" / "python")
    paths = [matrix_path("transformers", TRANSFORMERS)]
    if function == "unsloth":
        paths.append(matrix_path("unsloth-zoo", UNSLOTH_ZOO))
    with ThreadPoolExecutor(2) as pool:
        without, with_hotfix = pool.map(lambda on: _compile_case(python, paths, function, on), (False, True))
    assert without["torch"] == TORCH and without["hotfix"] is False, without
    assert with_hotfix["hotfix"] is True, with_hotfix
    assert without["status"] == "equal", without  # compiled: upstream trains with equal gradients
    assert with_hotfix["status"] == "equal", with_hotfix  # was: crash, RecursionError
    assert [step["missing"] for step in with_hotfix["steps"]] == [0, 0], with_hotfix
    for key in ("graphs", "breaks", "frames", "recompiles"):
        assert with_hotfix[key] == without[key], (key, without, with_hotfix)
    assert with_hotfix["recompiles"] == 0, with_hotfix
