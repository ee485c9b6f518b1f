"""tools/hotfix_lab/census/forks.py's plan and page, without running a fork (its children are stand-ins).

Found 2026-11-30 measuring axolotl 0.20.0 and 0.21.0: ``run_release`` looped over a release's children with a loop
variable named like its ``phases`` argument, so every checkpoint function after a release's first ran only the child
of the last phase (axolotl's disk variant: no upstream or hotfix run), and the page drew the missing cells "n/a",
which says the release has no such function.
"""

from __future__ import annotations

import types

from hotfix_lab.census import forks


def test_every_function_of_a_release_runs_every_child(monkeypatch, tmp_path):
    started = []

    def child(args, env=None, cwd=None, timeout=None):
        started.append((args[3], tuple(args[4:])))
        return types.SimpleNamespace(stdout="", stderr="", returncode=0)

    from hotfix.diagnostics import children

    monkeypatch.setattr(children, "run_python", child)
    monkeypatch.setattr(forks, "install", lambda name, version: tmp_path)
    rows = []
    forks.run_release("axolotl", "0.21.0", "5.20.1", rows.append, 60.0)
    for function in forks.FUNCTIONS["axolotl"]:
        kinds = {"--activate" in args for name, args in started if name == function}
        assert kinds == {True, False}, (function, started)  # upstream then hotfix; hotfix without the fork's fix
        assert {r["phase"] for r in rows if r["function"] == function} == set(forks.PHASES), function


def test_a_cell_without_rows_is_not_measured_never_absent():
    assert forks._cell([], "upstream") == "not measured"
    absent = dict(phase="upstream", verdict="n/a")
    assert forks._cell([absent], "upstream") == "n/a"
    assert forks._cell([dict(absent, verdict="crash")], "upstream") == "broken"
