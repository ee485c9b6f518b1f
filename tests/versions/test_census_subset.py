"""The census tool itself, on a CI-sized subset: one release of the matrix, torch's function, a few cells.

tools/census/census.py runs the cells of 4.56.2 without and with hotfix into a temporary store and
renders its page: the Whisper keyword-tensor cell is broken upstream and equal with hotfix, the
release-absent Gemma-4 cell is n/a, and the page shows both.  (The full census runs for hours; its
committed rows are checked by test_version_gates.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO, clean_env, matrix_path


def test_census_subset(tmp_path):
    matrix_path("transformers", "4.56.2")
    store, doc = tmp_path / "census.jsonl", tmp_path / "versions.md"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "census" / "census.py"), "--dimension", "transformers",
                           "--releases", "4.56.2", "--functions", "torch", "--results", str(store), "--doc", str(doc),
                           "--cells", "whisper/full,gemma4+kv_shared/full,git/lora-input-grads"],
                          env=clean_env({"OMP_NUM_THREADS": "1"}), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = {(r["case"], r["hotfix"]): r for r in map(json.loads, store.read_text().splitlines())}
    assert len(rows) == 6, sorted(rows)
    assert rows[("whisper/full", False)]["verdict"] == "crash" and rows[("whisper/full", True)]["verdict"] == "equal"
    assert rows[("git/lora-input-grads", False)]["verdict"] == "crash"
    assert rows[("git/lora-input-grads", True)]["verdict"] == "equal"
    assert {rows[("gemma4+kv_shared/full", on)]["verdict"] for on in (False, True)} == {"n/a"}
    page = doc.read_text()
    assert "| 4.56.2 | broken → equal |" in page, page  # keyword-tensors, the first column
    assert "## Broken with hotfix\n\nNone." in page, page
