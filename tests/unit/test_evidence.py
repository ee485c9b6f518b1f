"""tests/support/evidence.py: an upstream half recorded is the answer until its key changes, and the cells sampled
at a commit are measured again and must agree with their record (a record cannot drift from upstream)."""

from __future__ import annotations

import pytest

from support import evidence

PARTS = {"transformers": "4.56.2", "cases": ["whisper"]}
GUARDS = ("tools/hotfix_lab/cases/grad_case.py",)


@pytest.fixture
def records(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "RECORDS", tmp_path)
    monkeypatch.delenv(evidence.MODE_VAR, raising=False)
    return tmp_path


def _count(record, cell, sampled):
    """A commit count at which ``cell`` is (not) sampled."""
    return next(n for n in range(evidence.SAMPLE_EVERY) if evidence.sampled(record, cell, n) is sampled)


def _ask(cell, value, calls):
    def measure():
        calls.append(cell)
        return value

    return evidence.upstream("layer-io", cell, PARTS, GUARDS, measure, facts=lambda v: v["status"])


def test_successive_commits_resample_every_cell_once_within_the_period():
    cells = [f"4.{minor}.0" for minor in range(40)]
    for cell in cells:
        hits = [n for n in range(100, 100 + evidence.SAMPLE_EVERY) if evidence.sampled("layer-io", cell, n)]
        assert len(hits) == 1, (cell, hits)
    assert all(evidence.sampled("layer-io", cell, -1) for cell in cells)  # no git: every cell measured


def test_a_recorded_cell_is_read_not_measured_and_a_sampled_one_is_measured_again(records, monkeypatch):
    calls = []
    monkeypatch.setenv(evidence.MODE_VAR, "record")
    assert _ask("4.56.2", {"status": "crash"}, calls) == {"status": "crash"} and calls == ["4.56.2"]
    assert evidence.read("layer-io")["4.56.2"]["facts"] == "crash"
    monkeypatch.delenv(evidence.MODE_VAR)

    monkeypatch.setattr(evidence, "commit_count", lambda: _count("layer-io", "4.56.2", sampled=False))
    assert _ask("4.56.2", {"status": "never measured"}, calls) == {"status": "crash"} and calls == ["4.56.2"]

    monkeypatch.setattr(evidence, "commit_count", lambda: _count("layer-io", "4.56.2", sampled=True))
    assert _ask("4.56.2", {"status": "crash", "error": "again"}, calls) == {"status": "crash", "error": "again"}
    assert calls == ["4.56.2", "4.56.2"]


def test_a_sampled_cell_that_disagrees_with_its_record_fails(records, monkeypatch):
    monkeypatch.setenv(evidence.MODE_VAR, "record")
    _ask("4.56.2", {"status": "crash"}, [])
    monkeypatch.setenv(evidence.MODE_VAR, "full")  # every cell measured, as a sampled one is
    with pytest.raises(pytest.fail.Exception, match="upstream now shows 'equal'.*HOTFIX_EVIDENCE=record"):
        _ask("4.56.2", {"status": "equal"}, [])


def test_a_changed_key_measures_again_and_says_the_record_is_missing(records, monkeypatch, capsys):
    monkeypatch.setenv(evidence.MODE_VAR, "record")
    _ask("4.56.2", {"status": "crash"}, [])
    monkeypatch.delenv(evidence.MODE_VAR)
    monkeypatch.setattr(evidence, "commit_count", lambda: _count("layer-io", "4.56.2", sampled=False))
    calls = []
    value = evidence.upstream("layer-io", "4.56.2", dict(PARTS, torch="2.99.0"), GUARDS,
                              lambda: calls.append(1) or {"status": "equal"}, facts=lambda v: v["status"])
    assert value == {"status": "equal"} and calls == [1]  # another torch: no current record, no disagreement
    assert "evidence layer-io/4.56.2: no current record" in capsys.readouterr().err


def test_an_odd_mode_is_refused_with_the_values_it_takes(records, monkeypatch):
    monkeypatch.setenv(evidence.MODE_VAR, "sometimes")
    with pytest.raises(ValueError, match="one of full, record, or unset"):
        _ask("4.56.2", {"status": "crash"}, [])
