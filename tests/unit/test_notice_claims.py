"""hotfix/notice.py in-process: one "repaired" line per fix and job, and the claims that make it one per job.

A second :class:`RepairNotice` in this process stands in for a sibling process of the same job (the job
is multiprocessing's authkey, which this process shares with itself).  Fix names are drawn fresh per
test, so the claims never meet another test's; the temporary folder is the test's own.
"""

from __future__ import annotations

import os
import tempfile
import uuid

import pytest

from hotfix import notice
from hotfix.notice import REPAIR_NOTICE, RepairNotice


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """The claims go to ``tmp_path``; no rank, no silencing level set."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name in ("RANK", "LOCAL_RANK", "HOTFIX_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path
    notice._remove_job_folder(os.getpid())  # what this process's exit would do


def _lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith(REPAIR_NOTICE)]


def _fix():
    return f"fix-{uuid.uuid4().hex[:8]}"


def test_each_fix_says_its_own_line_once(own_tmp, capsys):
    first, second, speaker = _fix(), _fix(), RepairNotice()
    for _ in range(3):
        speaker.say(first, "what one did", "upstream#1")
        speaker.say(second, "what two did", "upstream#2", call="a forward of the input embeddings")
    lines = _lines(capsys)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{REPAIR_NOTICE}a checkpointed call (what one did; {first}, upstream#1)"), lines
    assert lines[1].startswith(f"{REPAIR_NOTICE}a forward of the input embeddings (what two did; {second}, "), lines


def test_a_second_process_of_the_job_finds_the_claim_and_stays_silent(own_tmp, capsys):
    fix = _fix()
    RepairNotice().say(fix, "what", "upstream")
    RepairNotice().say(fix, "what", "upstream")  # same authkey: the same job
    assert len(_lines(capsys)) == 1
    assert os.path.exists(notice.claim_path(fix))
    notice._remove_job_folder(os.getpid())  # the job's first process exits: its claims go
    assert not os.path.exists(notice.job_folder())


def test_a_claim_folder_that_is_not_ours_is_not_used_and_the_line_is_said(own_tmp, capsys):
    fix, elsewhere = _fix(), own_tmp / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, notice.job_folder())
    RepairNotice().say(fix, "what", "upstream")
    RepairNotice().say(fix, "what", "upstream")
    assert len(_lines(capsys)) == 2  # no claim could be made: said rather than lost
    assert list(elsewhere.iterdir()) == []
    os.unlink(notice.job_folder())


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"LOCAL_RANK": "2"}, {"HOTFIX_LOG_LEVEL": "warning"}])
def test_other_ranks_and_silencing_levels_say_nothing_and_claim_nothing(own_tmp, capsys, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fix = _fix()
    RepairNotice().say(fix, "what", "upstream")
    assert _lines(capsys) == []
    assert not os.path.exists(notice.claim_path(fix))
