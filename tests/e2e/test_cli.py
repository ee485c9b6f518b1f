"""The command line a user meets first: `hotfix doctor` (the README's main job) and `python -m hotfix`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO, clean_env, run_python


def _hotfix_command() -> str:
    script = Path(sys.executable).with_name("hotfix")
    assert script.exists(), "the wheel installs a `hotfix` console script"
    return str(script)


def test_doctor_reproduces_and_fixes_on_4_56_2():
    """`hotfix doctor` crashes the tiny Whisper without hotfix, trains it with, exit 0."""
    proc = subprocess.run([_hotfix_command(), "doctor"], env=clean_env(), cwd=str(REPO),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "without hotfix (HOTFIX_DISABLE=1): CRASH   RuntimeError: Trying to backward through the graph a second time" in out
    assert "with hotfix:                       TRAINS" in out
    assert "84 missing" in out  # frozen decoder embeddings: silent gradient loss upstream
    assert "verdict: this environment has the bug, and hotfix fixes it." in out


def test_python_dash_m_hotfix_defaults_to_status():
    """`python -m hotfix` prints the status report without importing targets when asked."""
    proc = run_python(["-m", "hotfix", "status", "--no-import"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "transformers-checkpoint-layer-io" in proc.stdout
    assert "HOTFIX_DISABLE=''" in proc.stdout
    proc = run_python(["-m", "hotfix"], timeout=300)
    assert proc.returncode == 0 and "libraries:" in proc.stdout


def test_doctor_verdict_holds_under_pythonwarnings_error():
    """Under ``PYTHONWARNINGS=error`` the doctor's own bookkeeping (the loss as a
    float) must not turn into a false "still broken" verdict."""
    proc = subprocess.run([_hotfix_command(), "doctor"], env=clean_env({"PYTHONWARNINGS": "error"}), cwd=str(REPO),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ERROR" not in proc.stdout, proc.stdout
    assert "with hotfix:                       TRAINS" in proc.stdout, proc.stdout
    assert "verdict: this environment has the bug, and hotfix fixes it." in proc.stdout, proc.stdout
