"""One rule for a float32 difference of rounding size (hotfix_lab.sweep.sweep_rounding), used by the sweep and the
census: which rows are measured again in float64, and what the float64 row settles."""

from __future__ import annotations

from types import SimpleNamespace

from hotfix_lab.census import cells
from hotfix_lab.sweep import sweep_models
from hotfix_lab.sweep import sweep_rounding


def _mode(status="wrong", wrong=1, missing=0, unexpected=0, max_error=1.1e-6, summary="56/57 gradients equal"):
    return {"status": status, "wrong": wrong, "missing": missing, "unexpected": unexpected, "max_error": max_error,
            "total": 57, "summary": summary}


def _row(model="doge", recipe="lora", **modes):
    modes = modes or {"reentrant": _mode()}
    result = "pass" if all(m["status"] == "equal" for m in modes.values()) else "FAIL"
    return {"model_type": model, "recipe": recipe, "result": result, "modes": modes}


EQUAL = _mode(status="equal", wrong=0, max_error=0.0, summary="57/57 gradients equal")
EQUAL64 = _mode(status="equal", wrong=0, max_error=2e-15, summary="57/57 gradients equal (float64)")


def test_only_value_differences_of_rounding_size_are_measured_again():
    assert sweep_rounding.rounding_modes(_row()) == ["reentrant"]
    assert sweep_rounding.rounding_modes(_row(reentrant=_mode(), **{"non-reentrant": _mode()})) == \
        ["non-reentrant", "reentrant"]
    assert not sweep_rounding.rounding_modes(_row(reentrant=_mode(max_error=0.5)))  # a real difference
    assert not sweep_rounding.rounding_modes(_row(reentrant=_mode(missing=1)))  # a gradient gone is never rounding
    assert not sweep_rounding.rounding_modes(_row(reentrant=_mode(unexpected=12, wrong=0, max_error=0.0)))  # LiLT
    assert not sweep_rounding.rounding_modes(_row(reentrant=_mode(status="crash")))
    assert not sweep_rounding.rounding_modes(_row(reentrant=EQUAL))
    # every failing mode must be rounding: a crash beside it keeps the row as it is
    assert not sweep_rounding.rounding_modes(_row(reentrant=_mode(), **{"non-reentrant": _mode(status="crash")}))
    # ... unless the caller judges one mode only (the census: reentrant)
    assert sweep_rounding.rounding_modes(_row(reentrant=_mode(), **{"non-reentrant": _mode(status="crash")}),
                                         ("reentrant",)) == ["reentrant"]
    old = _row()
    del old["modes"]["reentrant"]["unexpected"]  # a row from before the field: never assumed clean
    assert not sweep_rounding.rounding_modes(old)
    assert not sweep_rounding.rounding_modes(dict(_row(), dtype="float64"))
    assert not sweep_rounding.rounding_modes(sweep_rounding.settle(_row(), None))  # settled once


def test_equal_in_float64_passes_and_says_so_otherwise_the_float32_fail_stands():
    settled = sweep_rounding.settle(_row(), _row(reentrant=EQUAL64))
    assert settled["result"] == "pass" and settled["modes"]["reentrant"]["status"] == "wrong"  # float32 kept
    assert settled["float64"] == {"reentrant": {"status": "equal", "summary": "57/57 gradients equal (float64)",
                                                "max_error": 2e-15}}
    assert sweep_rounding.rounding_note(settled) == "reentrant 1/57 differ by up to 1.1e-06 in float32, equal in float64"
    wrong64 = _row(reentrant=_mode(max_error=1e-3, summary="56/57 gradients equal (float64)"))
    assert sweep_rounding.settle(_row(), wrong64)["result"] == "FAIL"
    gone = sweep_rounding.settle(_row(), {"result": "died", "detail": "worker died"})
    assert gone["result"] == "FAIL" and gone["float64"]["reentrant"] == {"status": "not run", "summary": "worker died"}
    # both modes rounding, one equal in float64 only: still FAIL
    both = _row(reentrant=_mode(), **{"non-reentrant": _mode()})
    half = _row(reentrant=EQUAL64, **{"non-reentrant": _mode(max_error=1e-4)})
    assert sweep_rounding.settle(both, half)["result"] == "FAIL"
    # the census judges reentrant only: a non-reentrant crash beside it leaves the sweep row FAIL
    mixed = _row(reentrant=_mode(), **{"non-reentrant": _mode(status="crash")})
    assert sweep_rounding.settle(mixed, _row(reentrant=EQUAL64), ("reentrant",))["result"] == "FAIL"


def test_the_census_reads_the_settled_row():
    row = sweep_rounding.settle(_row("wavlm", "full"), _row(reentrant=EQUAL64))  # a census cell
    census = cells.transformers_row(row, "5.13.1", True, "unsloth")
    assert census["verdict"] == "equal"
    assert census["detail"].startswith("float64: 57/57") and "float32 rounding: 56/57" in census["detail"]
    row = sweep_rounding.settle(_row("wavlm", "full"), {"result": "died", "detail": "worker died"})
    census = cells.transformers_row(row, "5.13.1", True, "unsloth")
    assert census["verdict"] == "wrong" and "float64 too: worker died" in census["detail"]


def test_a_run_measures_rounding_rows_again_in_float64_before_its_end_marker(monkeypatch):
    """sweep_models.run_worker_rechecked with the worker replaced: which cells go to float64, what reaches the sink."""
    calls = []

    def fake_worker(version, hotfix_on, function, models, done, args, sink):
        calls.append((args.dtype, models, args.recipes))
        if args.dtype == "float32":
            sink(_row("doge", "lora"))  # rounding: held
            sink(_row("doge", "full", reentrant=EQUAL))
            sink(_row("bert", "lora", reentrant=_mode(missing=3)))  # a defect: as it is
            sink(_row("t5gemma", "lora"))  # rounding, but float64 gives no row
            sink({"model_type": "__done__", "result": "marker"})
        else:
            sink(_row("doge", "lora", reentrant=EQUAL64))
            sink({"model_type": "__done__", "result": "marker"})

    monkeypatch.setattr(sweep_models, "run_worker", fake_worker)
    got = []
    args = SimpleNamespace(dtype="float32", recipes="full,lora", memory_limit=1, time_limit=1, model_timeout=1)
    sweep_models.run_worker_rechecked("4.56.2", True, "torch", None, set(), args, got.append)
    assert calls == [("float32", None, "full,lora"), ("float64", ["doge", "t5gemma"], "lora")]
    assert [(r["model_type"], r.get("recipe"), r["result"]) for r in got] == [
        ("doge", "full", "pass"), ("bert", "lora", "FAIL"), ("doge", "lora", "pass"), ("t5gemma", "lora", "FAIL"),
        ("__done__", None, "marker")]
    assert got[3]["float64"]["reentrant"]["summary"] == "no float64 row"
