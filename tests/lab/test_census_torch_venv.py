"""A side torch venv (hotfix_lab.census.census torch_venv) on a machine without the disk for it: nothing installed,
one line saying why, and the tests that need it skip with that line instead of failing (CI included)."""

from __future__ import annotations

import shutil
import subprocess
from collections import namedtuple

import pytest

import conftest
from hotfix_lab.census import census

Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(census, "MATRIX", tmp_path)
    monkeypatch.setattr(conftest, "MATRIX", tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * 2**30, 8 * 2**30, 2 * 2**30))

    def no_install(*args, **kwargs):
        raise AssertionError(f"installed with too little disk: {args}")

    monkeypatch.setattr(subprocess, "run", no_install)
    return tmp_path


def test_too_little_disk_installs_nothing_and_says_why(small_disk, capsys):
    with pytest.raises(census.NoDiskForTorch, match=r"2\.0 GiB free on disk, its venv needs about 9 GiB"):
        census.torch_venv("2.7.1", wheel="unused.whl")
    assert not (small_disk / "torch-2.7.1").exists()
    assert (small_disk / "torch-2.7.1.no-disk").read_text().startswith("torch 2.7.1 not installed: 2.0 GiB free")
    assert census.main(["--install-torch", "2.7.1", "--wheel", "unused.whl"]) == 0  # scripts/test.sh goes on
    assert capsys.readouterr().out.strip().splitlines() == \
        ["census: torch 2.7.1 not installed: 2.0 GiB free on disk, its venv needs about 9 GiB "
         "(tools/hotfix_lab/census/census.py TORCH_VENV_DISK)"]


def test_tests_needing_that_torch_skip_with_the_reason_even_in_ci(small_disk, monkeypatch):
    monkeypatch.setattr(conftest, "IN_CI", True)
    with pytest.raises(census.NoDiskForTorch):
        census.torch_venv("2.7.1", wheel="unused.whl")
    with pytest.raises(pytest.skip.Exception, match="torch 2.7.1 not installed: 2.0 GiB free"):
        conftest.matrix_path("torch", "2.7.1")
    with pytest.raises(pytest.fail.Exception, match="is not installed; run scripts/test.sh"):
        conftest.matrix_path("torch", "2.11.0")  # missing for another reason: CI still fails


def test_a_later_install_with_the_disk_clears_the_reason(small_disk, monkeypatch):
    (small_disk / "torch-2.7.1.no-disk").write_text("torch 2.7.1 not installed: earlier\n")
    (small_disk / "torch-2.7.1").mkdir()
    (small_disk / "torch-2.7.1" / ".complete").touch()  # installed since: only hotfix's wheel goes in again
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    census.torch_venv("2.7.1", wheel="hotfix.whl")
    assert not (small_disk / "torch-2.7.1.no-disk").exists()
    assert len(calls) == 2 and calls[0][-1] == "hotfix.whl", calls
    assert calls[1][1:] == ["-P", "-m", "hotfix_lab.infra.pth"], calls  # the lab on that venv's path
