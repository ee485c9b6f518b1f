"""The checkpoint_wrapper census (hotfix_lab.census.wrapper, docs/census/wrapper.md) against torch-checkpoint-wrapper's
declared range.

Every census transformers release from 4.52.0 was measured under the census torches (2.13.0, 2.14.1), and a few
under other torch lines (2.7.1, 2.11.0, 2.15.0):
tiny Llama, Whisper, Whisper + LoRA, both ``CheckpointImpl``s, in one process and under FSDP2 (one gloo rank),
without and with hotfix.  The gate: inside the declared range upstream is wrong or fails (Llama, Whisper) and with
hotfix every gradient equals the step without checkpointing; with hotfix never worse than upstream.  The page
re-renders from the rows byte for byte.  The cases themselves run in tests/e2e/test_torch_checkpoint_wrapper.py.
"""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from hotfix_lab.census import releases
from hotfix_lab.sweep import sweep_store
from hotfix_lab.census import wrapper

from hotfix.patches.torch_checkpoint_wrapper import patch


def _rows():
    return [json.loads(line) for line in sweep_store.read_lines(wrapper.STORE)]


@pytest.mark.parametrize("torch", releases.CENSUS_TORCHES)
def test_every_reached_release_has_every_cell_under_each_census_torch(torch):
    measured = {(r["release"], r["engine"], r["model"], r["impl"], r["hotfix"]) for r in _rows()
                if r["torch"] == torch and r["verdict"] != "error"}
    missing = [(release, engine, model, impl, hotfix)
               for release in releases.transformers_releases() if Version(release) >= Version(wrapper.FIRST)
               for engine in wrapper.ENGINES for model in wrapper.MODELS for impl in wrapper.IMPLS
               for hotfix in (False, True) if (release, engine, model, impl, hotfix) not in measured]
    assert missing == [], (len(missing), missing[:5])


def test_wrapper_rows_hold_the_declared_range():
    assert wrapper.gate_problems(_rows(), patch) == []


def test_the_gate_catches_a_fix_that_does_not_repair():
    def row(hotfix, verdict, detail):
        return {"dimension": "wrapper", "release": "4.56.2", "torch": "2.13.0", "engine": "plain", "model": "llama",
                "impl": "reentrant", "hotfix": hotfix, "verdict": verdict, "detail": detail}

    found = wrapper.gate_problems([row(False, "wrong", "8/21 parameter gradients equal"),
                                   row(True, "wrong", "8/21 parameter gradients equal")], patch)
    assert any("with hotfix: wrong 8/21" in p for p in found), found
    found = wrapper.gate_problems([row(False, "equal", "21/21"), row(True, "equal", "21/21")], patch)
    assert found == ["4.56.2 (torch 2.13.0, plain) is inside the declared range but every case is equal upstream"]


def test_the_page_renders_from_the_rows(tmp_path):
    page = tmp_path / "wrapper.md"
    wrapper.render(_rows(), page)
    assert page.read_text() == wrapper.DOC.read_text()
