"""The CI subset of the model sweep (tools/sweep_models.py --fast; full sweep: docs/sweep.md).

Four model types on transformers 4.56.2, built generically from shrunk configs
(the same code path as the full sweep), each checked with hotfix off
(HOTFIX_DISABLE=1) and on: the two in hotfix's class must fail unpatched and
pass patched; the two that were never broken must pass both ways.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO, matrix_path

EXPECTED = {  # model type -> (unpatched, patched)
    "bert": ("pass", "pass"),
    "deberta-v2": ("pass", "pass"),  # default config: relative attention off, nothing passed by keyword
    "layoutlm": ("FAIL", "pass"),  # reentrant: no gradient reaches the encoder
    "whisper": ("FAIL", "pass"),  # reentrant: "backward through the graph a second time"
}


def test_fast_sweep(tmp_path):
    matrix_path("transformers", "4.56.2")
    results, doc = tmp_path / "fast.jsonl", tmp_path / "fast.md"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "sweep_models.py"), "--fast", "--fresh",
         "--results", str(results), "--doc", str(doc)],
        capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    got = {}
    for row in rows:
        if row["model_type"] != "__done__":
            got.setdefault(row["model_type"], {})[row["hotfix"]] = row
    assert set(got) == set(EXPECTED), got
    for model_type, (before, after) in EXPECTED.items():
        assert got[model_type][False]["result"] == before, got[model_type][False]
        assert got[model_type][True]["result"] == after, got[model_type][True]
        assert got[model_type][False]["transformers"] == "4.56.2"
    reentrant = got["layoutlm"][False]["modes"]["reentrant"]
    assert reentrant["status"] == "wrong" and reentrant["missing"] > 0
    assert got["whisper"][False]["modes"]["reentrant"]["status"] == "crash"
    table = doc.read_text()
    assert "| whisper | WhisperModel | 4.56.2 | **FAIL**" in table and "fixed by hotfix" in table
    assert "transformers 4.56.2" in table and "complete" in table and "INCOMPLETE" not in table
