"""The DDP census (hotfix_lab.census.ddp, docs/census/ddp.md) against transformers-ddp-find-unused's declared range,
and its direct cases against torch-ddp-find-unused's.

Every census transformers release was measured under torch 2.13.0 and 2.14.1: one DDP rank with
``find_unused_parameters=True``, LoRA and full fine-tuning, torch's and unsloth-zoo's reentrant
checkpoint, without and with hotfix.  The gate: inside the declared range upstream fails with
"Expected to mark a variable ready only once" and with hotfix every gradient equals DDP without
checkpointing; outside it no release shows the defect; with hotfix never worse than upstream.  The direct
cases (a Hub-style model calling its own ``checkpoint``, through torch's class and unsloth's swapped in):
upstream the defect, with hotfix equal, on every release (torch-ddp-find-unused's ranges hold every census torch
and the unsloth-zoo release measured).
The cases themselves run in tests/e2e/test_ddp_find_unused.py (two ranks) and
tests/unit/test_ddp_find_unused_calls.py.
"""

from __future__ import annotations

import json

import pytest

from hotfix_lab.census import ddp
from hotfix_lab.census import releases
from hotfix_lab.sweep import sweep_store

from hotfix.patches.torch_ddp_find_unused import patch as direct_patch
from hotfix.patches.transformers_ddp_find_unused import patch

TORCH = "2.13.0"  # the synthetic rows' torch


def _rows():
    return [json.loads(line) for line in sweep_store.read_lines(ddp.STORE)]


@pytest.mark.parametrize("torch", releases.CENSUS_TORCHES)
def test_every_census_release_has_every_ddp_cell(torch):
    rows = _rows()
    measured = {(r["release"], r["function"], r["case"], r["hotfix"]) for r in rows
                if r["torch"] == torch and r["verdict"] != "error"}
    missing = [(release, function, recipe, hotfix) for release in releases.transformers_releases()
               for function, recipe in ddp.CASES for hotfix in (False, True)
               if (release, function, recipe, hotfix) not in measured]
    assert missing == [], (len(missing), missing[:5])


def test_ddp_rows_hold_the_declared_range():
    assert ddp.gate_problems(_rows(), patch) == []


def test_the_direct_rows_hold_torch_ddp_find_unused_ranges():
    rows = _rows()
    assert {r["function"] for r in rows if r["case"] == "direct"} == {"torch", "unsloth"}
    assert ddp.direct_gate_problems(rows, direct_patch) == []


DEFECT_ERROR = f"RuntimeError: {ddp.DEFECT}"


def _row(release, function, case, hotfix, verdict, detail=""):
    return {"dimension": "ddp", "release": release, "torch": TORCH, "function": function, "case": case,
            "hotfix": hotfix, "verdict": verdict, "detail": detail}


def test_the_direct_gate_catches_a_fix_that_does_not_repair_and_a_defect_gone_upstream():
    found = ddp.direct_gate_problems([_row("5.24.0", "torch", "direct", False, "crash", DEFECT_ERROR),
                                      _row("5.24.0", "torch", "direct", True, "crash", DEFECT_ERROR),
                                      _row("5.24.0", "unsloth", "direct", False, "equal", "13/13 gradients equal"),
                                      _row("5.24.0", "unsloth", "direct", True, "equal", "13/13 gradients equal")],
                                     direct_patch)
    assert any("torch direct call, hotfix on" in p and "mark-ready twice" in p for p in found), found
    assert any("unsloth direct call, hotfix off" in p and "upstream: equal" in p for p in found), found


def test_the_ddp_gate_catches_a_wrong_range_and_a_fix_that_does_not_repair():
    found = ddp.gate_problems([_row("4.56.2", "torch", "lora", False, "crash", DEFECT_ERROR),
                               _row("4.56.2", "torch", "lora", True, "crash", DEFECT_ERROR),
                               _row("5.23.0", "torch", "lora", False, "equal", "8/8 gradients equal"),
                               _row("5.23.0", "torch", "lora", True, "equal", "8/8 gradients equal")], patch)
    assert any("4.56.2" in p and "with hotfix: mark-ready twice" in p for p in found), found
    assert any("5.23.0" in p and "inside the declared range but upstream: equal" in p for p in found), found


def test_the_ddp_page_is_rendered_from_the_rows():
    assert ddp.DOC.read_text() == "\n".join(ddp.section(_rows())).rstrip() + "\n"
