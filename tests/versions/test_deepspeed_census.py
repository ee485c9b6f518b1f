"""The DeepSpeed census (hotfix_lab.census.deepspeed_census, docs/census/deepspeed.md) against deepspeed-zero3-frozen-recompute's
declared range.

Every census DeepSpeed release (the last of each line before 0.12, the first and the last of each line from 0.12,
the releases between them where those disagree, by bisection) was measured under the census torches (2.13.0,
2.14.1): a release that does not import or start its CPU accelerator with that torch as one row saying why;
every other one over ZeRO-2 / ZeRO-3, the tiny Whisper and Llama, LoRA and full, reentrant and non-reentrant,
2 ranks, without and with hotfix.  The gate: upstream fails with torch's "different metadata" CheckpointError in a
ZeRO-3 LoRA non-reentrant case exactly inside the declared deepspeed range, and with hotfix every case of every
running release equals the same training without checkpointing.  The page re-renders from the rows byte for byte.
Reads the stored rows only (nothing runs).  The cases themselves run in tests/e2e/test_deepspeed.py.
"""

from __future__ import annotations

import json

import pytest

from hotfix_lab.census import releases
from hotfix_lab.sweep import sweep_store

from hotfix_lab.census import deepspeed_census as census

from hotfix.patches.deepspeed_zero3_frozen_recompute import patch


def _rows():
    return [json.loads(line) for line in sweep_store.read_lines(census.STORE)]


@pytest.mark.parametrize("torch", releases.CENSUS_TORCHES)
def test_every_census_release_has_every_cell_under_each_census_torch(torch):
    rows = [r for r in _rows() if r["torch"] == torch and r["verdict"] != "error"]
    no_run = {r["release"] for r in rows if r["verdict"] == census.NO_RUN}
    measured = {(r["release"], r["case"], r["hotfix"]) for r in rows}
    wanted = set(census.base_releases()) | {r["release"] for r in rows}
    missing = [(release, case, hotfix) for release in sorted(wanted - no_run)
               for case in census.CASES for hotfix in (False, True) if (release, case, hotfix) not in measured]
    assert missing == [], (len(missing), missing[:5])
    assert census.open_bisections(_rows(), torch) == []
    assert not any(r["verdict"] == "error" for r in _rows() if r["torch"] == torch)


def test_deepspeed_rows_hold_the_declared_range():
    assert census.gate_problems(_rows(), patch) == []


def test_the_gate_catches_a_wrong_range_and_a_fix_that_does_not_repair():
    def rows(release, upstream, fixed):
        return [{"dimension": "deepspeed", "release": release, "torch": "2.13.0", "case": case, "hotfix": hotfix,
                 "verdict": "crash" if (hotfix and fixed or not hotfix and upstream) and case in census.FROZEN_CASES
                 else "equal",
                 "detail": "CheckpointError: torch.utils.checkpoint: Recomputed values for the following tensors "
                           "have different metadata than during the forward pass"
                 if (hotfix and fixed or not hotfix and upstream) and case in census.FROZEN_CASES else "8/8"}
                for case in census.CASES for hotfix in (False, True)]

    assert census.gate_problems(rows("0.19.2", True, False) + rows("0.19.3", False, False), patch) == []
    found = census.gate_problems(rows("0.19.2", False, False) + rows("0.19.3", True, True), patch)
    assert found == ["0.19.2 (torch 2.13.0) is inside the declared range but upstream has no metadata error",
                     "0.19.3 (torch 2.13.0) has the metadata error upstream but is outside the declared range",
                     "0.19.3 (torch 2.13.0) zero3:lora:nonreentrant: with hotfix CheckpointError (metadata)",
                     "0.19.3 (torch 2.13.0) zero3:whisper-lora:nonreentrant: with hotfix CheckpointError (metadata)"]


def test_where_deepspeed_fails_without_checkpointing_the_gate_asks_no_equal_cell_of_that_stage():
    """A stage whose control (no checkpointing anywhere) fails: its cases fail so with hotfix too, not the fix's."""
    split = "RuntimeError: Output 0 of Split is a view and is being modified inplace"
    rows = [{"dimension": "deepspeed", "release": "0.18.9", "torch": "2.13.0", "case": case, "hotfix": hotfix,
             "verdict": "crash" if case.startswith("zero2") or (not hotfix and case in census.FROZEN_CASES)
             else "equal",
             "detail": split if case.startswith("zero2") else "different metadata" if not hotfix and
             case in census.FROZEN_CASES else "8/8"}
            for case in census.CASES for hotfix in (False, True)]
    assert census.gate_problems(rows, patch) == []
    control = next(r for r in rows if r["case"] == census.CONTROLS[2] and r["hotfix"])
    control.update(verdict="equal", detail="8/8")
    assert "0.18.9 (torch 2.13.0) zero2:full:reentrant: with hotfix in-place on a Split view" in \
        census.gate_problems(rows, patch)


def test_the_page_renders_from_the_rows(tmp_path):
    page = tmp_path / "deepspeed.md"
    census.render(_rows(), page)
    assert page.read_text() == census.DOC.read_text()
