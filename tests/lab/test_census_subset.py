"""The census tool itself, on a CI-sized subset: releases of the matrix, a few cells of each kind.

tools/hotfix_lab/census/census.py runs, into a temporary store, without and with hotfix: on transformers 4.56.2
through torch's function and unsloth-zoo's (2026.10.9 on CPU) a sweep cell (Whisper's keyword tensors: broken upstream, equal with hotfix),
a lab cell (a third-party GradientCheckpointingLayer), a release-absent cell (Gemma-4: n/a) and a cell
whose step without checkpointing crashes upstream (GIT's input-grad hook); and unsloth-zoo 2025.11.3
with the transformers line of its time (4.57.6), every zoo case.  Then it renders the page.  And one torch
line (``--torch 2.11.0``: the census re-runs itself in scripts/test.sh's .matrix/torch-2.11.0) with a lab
cell and the compile column's Whisper (eager backend).  (The full census runs for hours; its committed rows
are checked by test_version_gates.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import clean_env, matrix_path


def _census(tmp_path, *args):
    store, doc = tmp_path / "census.jsonl", tmp_path / "versions.md"
    proc = subprocess.run([sys.executable, "-P", "-m", "hotfix_lab.census.census", *args, "--jobs", "2",
                           "--results", str(store), "--doc", str(doc)],
                          env=clean_env({"OMP_NUM_THREADS": "1"}), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return store, doc


def test_census_subset(tmp_path):
    for name, version in [("transformers", "4.56.2"), ("transformers", "4.57.6"), ("unsloth-zoo", "2025.11.3"),
                          ("unsloth-zoo", "2026.10.9")]:
        matrix_path(name, version)  # installed by scripts/test.sh: the census installs nothing here
    store, doc = _census(tmp_path, "--dimension", "transformers", "--releases", "4.56.2", "--functions", "torch,unsloth",
                         "--cells", "whisper/full,gemma4+kv_shared/full,git/lora-input-grads,lab/custom-layer")
    store, doc = _census(tmp_path, "--dimension", "unsloth-zoo", "--releases", "2025.11.3")
    rows = {(r["case"], r["function"], r["hotfix"]): r for r in map(json.loads, store.read_text().splitlines())}
    assert len(rows) == 16 + 8, sorted(rows)
    cells = [(case, function, upstream) for function in ("torch", "unsloth") for case, upstream in
             [("whisper/full", "crash"), ("git/lora-input-grads", "crash"), ("lab/custom-layer", "crash")]]
    cells += [(case, "unsloth", upstream) for case, upstream in
              [("zoo/closure", "crash"), ("zoo/whisper", "crash"), ("zoo/frozen", "crash"), ("zoo/offload", "late")]]
    for case, function, upstream in cells:
        found = (rows[(case, function, False)]["verdict"], rows[(case, function, True)]["verdict"])
        assert found == (upstream, "equal"), (case, function, found)
    assert {rows[("gemma4+kv_shared/full", f, on)]["verdict"] for f in ("torch", "unsloth") for on in (0, 1)} == {"n/a"}
    assert rows[("zoo/closure", "unsloth", True)]["transformers"] == "4.57.6"
    page = doc.read_text()
    assert "| 4.56.2 | broken → equal |" in page, page  # keyword-tensors, the first column
    assert "| 2025.11.3 | 4.57.6 | broken → equal | broken → equal | broken → equal |" in page, page
    assert "## Broken with hotfix\n\nNone." in page, page


@pytest.mark.side_torch  # scripts/test.sh runs it after the side torches are installed
def test_census_torch_line_subset(tmp_path):
    """The census under another torch: its venv, transformers 5.23.0 there (it imports with torch 2.11), a cell
    of the mechanism columns and one of the compile column, without and with hotfix."""
    matrix_path("torch", "2.11.0")  # installed by scripts/test.sh
    matrix_path("transformers", "5.23.0")
    store, doc = _census(tmp_path, "--torch", "2.11.0", "--functions", "torch",
                         "--cells", "lab/custom-layer,compile/whisper/eager")
    rows = {(r["case"], r["hotfix"]): r for r in map(json.loads, store.read_text().splitlines())}
    assert sorted(rows) == [(case, on) for case in ("compile/whisper/eager", "lab/custom-layer") for on in (False, True)]
    assert {r["torch"] for r in rows.values()} == {"2.11.0"} and {r["release"] for r in rows.values()} == {"5.23.0"}
    assert (rows[("lab/custom-layer", False)]["verdict"], rows[("lab/custom-layer", True)]["verdict"]) == ("crash", "equal")
    off, on = rows[("compile/whisper/eager", False)], rows[("compile/whisper/eager", True)]
    assert off["verdict"] == on["verdict"] == "equal", (off, on)
    assert [off[k] for k in ("graphs", "breaks", "frames", "recompiles")] == \
        [on[k] for k in ("graphs", "breaks", "frames", "recompiles")], (off, on)
    page = doc.read_text()
    assert "| 2.11.0 | 5.23.0 | torch |" in page, page
