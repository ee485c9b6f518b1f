"""The CI subset of the model sweep (tools/hotfix_lab/sweep/sweep_models.py --fast; full sweep: docs/sweep.md).

Four model types (and DeBERTa-v2's ``layer_norm`` variant, swept with it) on transformers 4.56.2, built generically from shrunk configs (the same code path
as the full sweep), each checked in every recipe (full fine-tuning, LoRA on the attention
projections with the base frozen without and with enable_input_require_grads(), a frozen tower)
with hotfix off (HOTFIX_DISABLE=1) and on.  Measured upstream (torch 2.13.0 CPU, reentrant):
LayoutLM and Whisper fail in full fine-tuning; LoRA without input grads loses every adapter
gradient on all four; with the input-grads hook Whisper's encoder adapters and LayoutLM's still get
none.  With hotfix every checked cell passes, and nothing that passes upstream fails with it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import matrix_path

RECIPES = ("full", "lora", "lora-input-grads", "frozen-tower")
UNPATCHED = {  # model type -> recipe -> result without hotfix
    "bert": {"full": "pass", "lora": "FAIL", "lora-input-grads": "pass", "frozen-tower": "n/a"},
    "deberta-v2": {"full": "pass", "lora": "FAIL", "lora-input-grads": "pass", "frozen-tower": "n/a"},
    # the variant the default config skips (hotfix_lab.sweep.sweep_families.config_variants): rel_embeddings= by keyword
    "deberta-v2+layer_norm": {"full": "FAIL", "lora": "FAIL", "lora-input-grads": "pass", "frozen-tower": "n/a"},
    "layoutlm": {"full": "FAIL", "lora": "FAIL", "lora-input-grads": "FAIL", "frozen-tower": "n/a"},
    "whisper": {"full": "FAIL", "lora": "FAIL", "lora-input-grads": "FAIL", "frozen-tower": "pass"},
}


def test_fast_sweep(tmp_path):
    matrix_path("transformers", "4.56.2")
    results, doc = tmp_path / "fast.jsonl", tmp_path / "fast.md"
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "hotfix_lab.sweep.sweep_models", "--fast", "--fresh", "--jobs", "2",
         "--results", str(results), "--doc", str(doc)],
        capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    got = {}
    for row in rows:
        if not row["model_type"].startswith("__"):
            got[(row["model_type"], row["recipe"], row["hotfix"])] = row
    assert {(t, r) for t, r, _ in got} == {(t, r) for t in UNPATCHED for r in RECIPES}, sorted(got)
    for model_type, expected in UNPATCHED.items():
        for recipe, before in expected.items():
            unpatched, patched = got[(model_type, recipe, False)], got[(model_type, recipe, True)]
            assert unpatched["result"] == before, unpatched
            assert patched["result"] == ("n/a" if before == "n/a" else "pass"), patched
            assert unpatched["transformers"] == "4.56.2"
    reentrant = got[("layoutlm", "full", False)]["modes"]["reentrant"]
    assert reentrant["status"] == "wrong" and reentrant["missing"] > 0
    assert got[("whisper", "full", False)]["modes"]["reentrant"]["status"] == "crash"
    lora = got[("whisper", "lora", False)]["modes"]["reentrant"]
    assert lora["missing"] == lora["total"] == 24, lora  # no adapter gradient at all
    table = doc.read_text()
    assert "| whisper | WhisperModel | **FAIL** → pass | **FAIL** → pass | **FAIL** → pass | pass |" in table
    assert "fixed by hotfix" in table and "NOT FIXED" not in table and "but fail with hotfix" not in table
    assert "transformers 4.56.2" in table and "complete" in table and "INCOMPLETE" not in table
    # the coverage line other tooling reads, over the census of every model type of the release
    match = re.search(r"^coverage 4\.56\.2: (\d+)/(\d+) model types$", table, re.M)
    assert match and int(match.group(1)) == 4 and int(match.group(2)) > 250, table[:3000]
