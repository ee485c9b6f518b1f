"""The census's verdict rules (tools/census/cells.py): when a float32 difference is measured again in float64."""

from __future__ import annotations

import sys

from conftest import TOOLS

sys.path.insert(0, str(TOOLS / "census"))
import cells  # noqa: E402


def _sweep_row(status="wrong", wrong=1, missing=0, unexpected=0, max_error=1.1e-6, summary="56/57 gradients equal"):
    mode = {"status": status, "wrong": wrong, "missing": missing, "unexpected": unexpected, "max_error": max_error,
            "summary": summary}
    return {"model_type": "wavlm", "recipe": "full", "result": "pass" if status == "equal" else "FAIL",
            "modes": {"reentrant": mode}}


def test_only_value_differences_of_rounding_size_are_measured_again():
    assert cells.rounding_sized(_sweep_row())
    assert not cells.rounding_sized(_sweep_row(max_error=0.5))  # a real difference
    assert not cells.rounding_sized(_sweep_row(missing=1))  # a gradient gone is never rounding
    assert not cells.rounding_sized(_sweep_row(unexpected=12, wrong=0, max_error=0.0))  # LiLT's zeros
    assert not cells.rounding_sized(_sweep_row(status="crash"))
    assert not cells.rounding_sized(_sweep_row(status="equal", wrong=0))
    row = _sweep_row()
    del row["modes"]["reentrant"]["unexpected"]  # a row from before the field: never assumed clean
    assert not cells.rounding_sized(row)


def test_equal_in_float64_is_equal_and_says_so_otherwise_the_float32_verdict_stands():
    row = _sweep_row()
    equal64 = _sweep_row(status="equal", wrong=0, max_error=1e-15, summary="57/57 gradients equal")
    census = cells.transformers_row(row, "5.13.1", True, "unsloth", float64=equal64)
    assert census["verdict"] == "equal"
    assert census["detail"].startswith("float64: 57/57") and "float32 rounding: 56/57" in census["detail"]
    wrong64 = _sweep_row(max_error=1e-3, summary="56/57 gradients equal (float64)")
    census = cells.transformers_row(row, "5.13.1", True, "unsloth", float64=wrong64)
    assert census["verdict"] == "wrong" and "float64 too: 56/57 gradients equal (float64)" in census["detail"]
    census = cells.transformers_row(row, "5.13.1", True, "unsloth", float64={"result": "died", "detail": "worker died"})
    assert census["verdict"] == "wrong" and "float64 too: worker died" in census["detail"]
