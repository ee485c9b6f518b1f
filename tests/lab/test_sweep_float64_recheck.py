"""The sweep measures a float32 difference of rounding size again in float64 (tools/hotfix_lab/sweep/sweep_rounding.py).

Informer's full fine-tuning on 4.56.2 differs between reentrant recomputation and a step without
checkpointing by about 1.5e-5 relative in float32 (with and without hotfix; no gradient missing): rounding.
In float64 (the model, the batch, and torch's default dtype during the steps, which its own masks follow) every
gradient is equal, so the row passes, its float32 numbers kept and the float64 ones beside them.  Before the
re-check the row stayed a FAIL, and borderline cells (doge LoRA at 1.0e-6) flipped between runs.

DeepSeek-OCR-2's batch is fitted to the model as built (as many image placeholders as a float32 forward makes
image features, ``sweep_inputs.fit_image_tokens``); with torch's default dtype float64 from the worker's start
(2026-11-27) that forward failed on float64 pixels against float32 weights, the batch kept no placeholder, and
the float64 run could not run ("Image features and image tokens do not match"): the row stayed a FAIL."""

from __future__ import annotations

from conftest import run_sweep


def test_a_rounding_sized_float32_difference_is_settled_in_float64(tmp_path):
    rows = run_sweep(tmp_path, "4.56.2", "informer", "full", "torch")
    assert sorted(r["hotfix"] for r in rows) == [False, True], rows
    for row in rows:
        fp32 = row["modes"]["reentrant"]
        assert fp32["status"] == "wrong" and fp32["missing"] == fp32["unexpected"] == 0, row
        assert 1e-6 < fp32["max_error"] < 1e-3, row  # rounding-sized, over the float32 tolerance
        assert row["float64"]["reentrant"]["status"] == "equal", row
        assert row["float64"]["reentrant"]["max_error"] < 1e-10, row
        assert row["result"] == "pass", row
        assert row["modes"]["non-reentrant"]["status"] == "equal", row


def test_a_model_whose_batch_is_fitted_to_it_runs_in_float64(tmp_path):
    """The float64 run itself (what the re-check starts), so the test does not hang on whether float32 rounding
    crosses the tolerance on this machine."""
    rows = run_sweep(tmp_path, "5.23.0", "deepseek_ocr2", "lora", "torch", dtype="float64")
    assert sorted(r["hotfix"] for r in rows) == [False, True], rows
    for row in rows:
        assert row["dtype"] == "float64" and row["result"] == "pass", row
        assert row["modes"]["reentrant"]["status"] == "equal" and row["modes"]["reentrant"]["max_error"] < 1e-10, row
