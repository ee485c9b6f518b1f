"""hotfix_lab.cases.grad_case's case names: ``CASE@default`` is the only suffix; any other is refused, not measured in
the child's own mode under a name that says otherwise (noticed 2026-11-30: ``whisper@defualt`` ran reentrant)."""

from __future__ import annotations

from conftest import run_python


def test_a_suffix_other_than_default_is_refused_before_anything_runs():
    proc = run_python(["-P", "-m", "hotfix_lab.cases.grad_case", "whisper@defualt"], timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "whisper@defualt: the only suffix is @default" in proc.stderr and proc.stdout == ""
