"""When a float32 gradient difference is rounding: one rule for the sweep and the census.

A float32 row (tools/hotfix_lab/sweep/sweep_worker.check_one) whose failing checkpoint modes each differ only in
values, every one within ``ROUNDING_SIZED`` (relative), with no gradient missing and none unexpected,
is measured again with model and inputs in float64 (``sweep_models.run_worker_rechecked``).  Rounding
shrinks there (the checker's float64 tolerance is 1e-10); a real difference does not.  :func:`settle`
records the float64 modes beside the float32 ones (``row["float64"]``) and makes the row pass only
where every mode is equal in float32 or in float64.  A gradient missing or unexpected, a crash, or a
larger difference is never re-measured: that is a defect, not rounding.

Before 2026-11-27 the sweep kept such float32 FAILs and explained the float64-checked ones by hand
(sweep_report.OUT_OF_SCOPE); borderline cells then flipped between runs (doge LoRA at 1.0e-6, t5gemma
LoRA at 7.7e-7, on 4.56.2).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

#: a float32 difference this close (relative) is measured again in float64
ROUNDING_SIZED = 1e-3


def _failing(row: Dict, modes: Optional[Iterable[str]]) -> Dict[str, Dict]:
    found = row.get("modes") or {}
    names = found if modes is None else [m for m in modes if m in found]
    return {m: found[m] for m in names if found[m].get("status") != "equal"}


def rounding_modes(row: Dict, modes: Optional[Iterable[str]] = None) -> List[str]:
    """The failing modes (of ``modes``; None: every mode) of a float32 FAIL row when each of them differs by
    rounding-sized values only, else []: one mode that is not rounding leaves the row as it is."""
    if row.get("result") != "FAIL" or row.get("dtype", "float32") != "float32" or "float64" in row:
        return []
    failing = _failing(row, modes)
    rounding = all(m.get("status") == "wrong" and m.get("wrong", 0) > 0 and m.get("missing", 1) == 0
                   and m.get("unexpected", 1) == 0  # rows from before the field: never assumed clean
                   and m.get("max_error", float("inf")) < ROUNDING_SIZED for m in failing.values())
    return sorted(failing) if failing and rounding else []


def settle(row: Dict, again: Optional[Dict], modes: Optional[Iterable[str]] = None) -> Dict:
    """``row`` with its :func:`rounding_modes` as measured in float64 (``again``: the same cell's float64 row, None
    if the run gave none) under ``float64``; "pass" where every mode is then equal, else still "FAIL"."""
    rechecked = rounding_modes(row, modes)
    if not rechecked:
        return row
    found = (again or {}).get("modes") or {}
    why = (again or {}).get("detail") or (again or {}).get("result") or "no float64 row"
    float64 = {m: ({k: found[m].get(k) for k in ("status", "summary", "max_error")} if m in found
                   else {"status": "not run", "summary": why}) for m in rechecked}
    settled = dict(row, float64=float64)
    left = set(_failing(row, None)) - {m for m, v in float64.items() if v["status"] == "equal"}
    if not left:
        settled["result"] = "pass"
    return settled


def rounding_note(row: Optional[Dict]) -> str:
    """'' or how ``row``'s float32 differences were settled in float64, for the page."""
    float64 = (row or {}).get("float64") or {}
    if not float64:
        return ""
    modes = row.get("modes") or {}
    parts = []
    for mode, again in float64.items():
        fp32 = modes.get(mode, {})
        outcome = {"equal": "equal in float64", "not run": f"float64 could not run ({again['summary'][:80]})"}.get(
            again["status"], f"float64 {again['status']} too ({again['summary'][:80]})")
        parts.append(f"{mode} {fp32.get('wrong')}/{fp32.get('total')} differ by up to {fp32.get('max_error', 0):.1e} "
                     f"in float32, {outcome}")
    return "; ".join(parts)
