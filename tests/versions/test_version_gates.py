"""The ranges each fix declares equal the census's evidence (issue 26), from the committed rows.

docs/census/ holds the rows of hotfix_lab.census.census (every transformers minor line from 4.35 to the newest and
every unsloth-zoo release since 2024.11.6, without and with hotfix, under torch 2.13.0 and 2.14.1; the
torch lines 2.4 - 2.15 on one release each, with the compile column); nothing is re-run here.
tools/hotfix_lab/census/gates.py says what "equal to the evidence" means; this test fails on any disagreement,
and when a release the census should cover has no rows.
"""

from __future__ import annotations

import json

from conftest import REPO
from hotfix_lab.census import boundaries
from hotfix_lab.census import cells
from hotfix_lab.census import gates
from hotfix_lab.census import releases
from hotfix_lab.census import render
from hotfix_lab.sweep import sweep_store

STORE = REPO / "docs" / "census"


def _rows():
    return [json.loads(line) for line in sweep_store.read_lines(STORE)]


#: the torch releases the census measures every release under
TORCHES = releases.CENSUS_TORCHES


def test_the_census_covers_every_release_it_should():
    """Every release of both dimensions under both torch releases, each cell with a verdict (none left as
    "error": a cell that could not be built or run is measured again by the next run, not published)."""
    rows = _rows()
    measured = {(r["torch"], r["dimension"], r["release"], r["function"], r["case"], r["hotfix"]) for r in rows}
    transformers_cases = [f"{model}/{recipe}" for model, recipe, _ in cells.CELLS]
    transformers_cases += [f"lab/{case}" for case, _ in cells.LAB_CELLS]
    expected = [(torch, "transformers", release, function, case, hotfix)
                for torch in TORCHES for release in releases.transformers_releases()
                for function in ("torch", "unsloth") for case in transformers_cases for hotfix in (False, True)]
    expected += [(torch, "unsloth-zoo", release, "unsloth", f"zoo/{case}", hotfix)
                 for torch in TORCHES for release, _ in releases.zoo_releases()
                 for case, _ in cells.ZOO_CASES for hotfix in (False, True)]
    missing = [cell for cell in expected if cell not in measured]
    assert missing == [], (len(missing), missing[:10])
    assert [r for r in rows if r["verdict"] == "error"] == []


#: the torch lines the census measured (tools/hotfix_lab/census/census.py --torch): each on one transformers release
#: (releases.TORCH_LINE_RELEASE, or the release of that torch's time), every mechanism cell and the eager
#: compile column; COMPILE_ONLY: the compile column only; INDUCTOR: lines with the inductor cases too.
#: Every line has the inductor column too (2026-11-27).
TORCH_LINES = ("2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0",
               "2.14.1", "2.15.0")
TORCH_LINES_COMPILE_ONLY = ()
TORCH_LINES_INDUCTOR = TORCH_LINES


def test_every_measured_torch_line_has_every_cell():
    """Every transformers and lab cell through both functions (unsloth's n/a with its reason where unsloth-zoo
    does not load under that torch), and the compile column, without and with hotfix."""
    rows = _rows()
    measured = {(r["torch"], r["dimension"], r["release"], r["function"], r["case"], r["hotfix"]): r for r in rows}
    missing = []
    for torch in TORCH_LINES + TORCH_LINES_COMPILE_ONLY:
        release = render._line_release(rows, torch)
        cases = []
        if torch in TORCH_LINES:
            cases += [("transformers", f"{model}/{recipe}") for model, recipe, _ in cells.CELLS
                      if f"{model}/{recipe}" not in cells.RELEASE_ONLY]
            cases += [("transformers", f"lab/{case}") for case, _ in cells.LAB_CELLS]
        cases += [("compile", f"compile/{model}/{backend}") for model, backend in cells.COMPILE_CASES
                  if backend == "eager" or torch in TORCH_LINES_INDUCTOR]
        missing += [(torch, dimension, release, function, case, hotfix) for dimension, case in cases
                    for function in ("torch", "unsloth") for hotfix in (False, True)
                    if (torch, dimension, release, function, case, hotfix) not in measured]
    assert missing == [], (len(missing), missing[:10])
    unsloth_na = [r for r in rows if r["function"] == "unsloth" and r["verdict"] == "n/a" and r["dimension"] == "compile"]
    assert all("does not load under torch" in r["detail"] for r in unsloth_na), unsloth_na[:3]


def test_hotfix_never_breaks_what_torch_compile_runs_upstream():
    """The compile column: on every torch line measured, with hotfix as without it (equal gradients where
    upstream has them, the same graphs, breaks, frames and recompiles), except the open defects the page lists:
    cells.COMPILE_OPEN_DEFECTS, each a line where hotfix does break what upstream runs (measured so)."""
    rows = _rows()
    assert gates.compile_problems(rows) == []
    unexcused = gates.compile_problems(rows, open_defects=())
    for torch in cells.COMPILE_OPEN_DEFECTS:
        assert any(f"torch {torch}," in p and "upstream equal, with hotfix crash" in p for p in unexcused), torch


def test_the_compile_rule_catches_hotfix_breaking_compile():
    def row(hotfix, verdict, graphs, case="compile/whisper/eager"):
        return {"dimension": "compile", "torch": "2.11.0", "release": "4.56.2", "function": "torch", "case": case,
                "hotfix": hotfix, "verdict": verdict, "detail": "", "graphs": graphs, "breaks": 4, "frames": 66,
                "recompiles": 0}

    found = gates.compile_problems([row(False, "equal", 5), row(True, "crash", None),
                                    row(False, "equal", 5, "compile/llama/eager"),
                                    row(True, "equal", 7, "compile/llama/eager")])
    assert any("compile/whisper/eager" in p and "with hotfix crash" in p for p in found), found
    assert any("compile/llama/eager" in p and "graphs 5 -> 7" in p for p in found), found
    assert gates.compile_problems([row(False, "equal", 5), row(True, "equal", 5)]) == []


def test_every_cell_broken_with_hotfix_says_why():
    """A cell that stays broken with hotfix is published with its reason, never bare: hotfix_lab.census.cells's, or
    its mechanism's ``Lost`` declaration there (what ``hotfix status`` says NOT COVERED with)."""
    fixes = gates.builtin_fixes()
    bare = {(r["torch"], r["case"], r["release"], r["function"]) for r in _rows()
            if r["hotfix"] and r["verdict"] in render.BROKEN and not cells.broken_reason(r)
            and not gates.lost_reason(r["mechanism"], r["dimension"], r["release"], fixes, cells.model_type_of(r["case"]))}
    assert sorted(bare) == []


def test_declared_ranges_equal_the_evidence():
    assert gates.problems(_rows(), gates.builtin_fixes()) == []


def test_the_gate_rules_catch_a_range_that_disagrees():
    """The rules themselves, on made-up rows: a broken release outside the range, a fine release inside it
    that hotfix changes, and a range that goes on after upstream fixed the mechanism."""
    from hotfix.patch import Mechanism

    class Fix:
        mechanisms = (Mechanism("m", {"transformers": ">=4.50,<5.0"}),)

    def row(release, hotfix, verdict):
        return {"dimension": "transformers", "torch": "2.13.0", "mechanism": "m", "release": release,
                "hotfix": hotfix, "verdict": verdict}

    rows = [row("4.49.0", False, "crash"), row("4.49.0", True, "crash"),
            row("4.55.0", False, "equal"), row("4.55.0", True, "wrong"),
            row("4.52.0", False, "wrong"), row("4.52.0", True, "equal"),
            row("4.56.0", False, "equal"), row("4.56.0", True, "equal")]
    found = gates.problems(rows, [Fix()])
    assert any("4.49.0" in p and "outside the declared range" in p for p in found), found
    assert any("4.55.0" in p and "not fine with hotfix" in p for p in found), found
    assert any("fixed upstream from transformers 4.55.0" in p for p in found), found


def test_a_broken_release_the_fix_declares_unreached_is_not_a_disagreement():
    """A release below the range that has the bug is fine for the gate when the mechanism declares it
    ``unreached`` (hotfix status then says NOT COVERED there), and a disagreement when it does not."""
    from hotfix.patch import Mechanism

    def row(release, hotfix, verdict):
        return {"dimension": "transformers", "torch": "2.13.0", "mechanism": "m", "release": release,
                "hotfix": hotfix, "verdict": verdict}

    rows = [row("4.34.1", False, "crash"), row("4.34.1", True, "crash"),
            row("4.35.0", False, "wrong"), row("4.35.0", True, "equal")]

    class Declared:
        mechanisms = (Mechanism("m", {"transformers": ">=4.35.0"}, unreached={"transformers": "<4.35.0"}),)

    class Silent:
        mechanisms = (Mechanism("m", {"transformers": ">=4.35.0"}),)

    assert gates.problems(rows, [Declared()]) == []
    assert any("4.34.1" in p and "outside the declared range" in p for p in gates.problems(rows, [Silent()]))


#: torch release -> {a line's last patch release: the cells where its first and last patch release disagree}: the
#: windows the bisect found (hotfix_lab.census.census --bisect, 2026-11-27).  Every other line agrees on every cell.
#: A re-measure that finds another window fails here until the window is read and added.
BISECT_WINDOWS = {torch: {"4.53.3": ["gemma3n_text+cache/full", "gemma3n_text/full"],
                          "5.5.4": ["gemma4+kv_shared/full", "gemma4+kv_shared_cache/full"]}
                  for torch in ("2.13.0", "2.14.1")}


def test_every_line_is_bisected_on_every_cell_and_its_windows_measured():
    """Patch releases at boundaries (issue 34): on both census torches, every line with several patch releases has
    its first and last patch release measured on every transformers and lab cell, the lines that disagree are the
    known windows, and each disagreeing cell is measured on every release between (boundaries.plan: nothing left)."""
    rows = _rows()
    every = {f"{model}/{recipe}" for model, recipe, _ in cells.CELLS} | {f"lab/{case}" for case, _ in cells.LAB_CELLS}
    for torch, windows in BISECT_WINDOWS.items():
        lines = boundaries.lines(rows, torch)
        assert {line.releases[0] for line in lines} == set(boundaries.firsts())
        for line in lines:
            missing = sorted(every - set(line.compared))
            assert line.measured and not missing, (torch, line.releases[0], missing)
        assert {line.releases[-1]: line.disagree for line in lines if line.disagree} == windows, torch
        assert boundaries.plan(rows, torch) == {}, torch


def test_the_bisect_measures_the_cells_where_a_line_changes_and_only_there():
    def row(release, case, hotfix, verdict):
        return {"dimension": "transformers", "torch": "2.13.0", "release": release, "function": "torch",
                "case": case, "hotfix": hotfix, "verdict": verdict}

    rows = [row(release, "a/full", hotfix, "equal") for release in ("5.5.0", "5.5.4") for hotfix in (False, True)]
    rows += [row("5.5.0", "b/full", False, "equal"), row("5.5.0", "b/full", True, "equal"),
             row("5.5.4", "b/full", False, "wrong"), row("5.5.4", "b/full", True, "equal")]
    assert boundaries.plan(rows, "2.13.0") == {v: ["b/full"] for v in ("5.5.1", "5.5.2", "5.5.3")}
    rows += [row(v, "b/full", h, "equal") for v in ("5.5.1", "5.5.2", "5.5.3") for h in (False, True)]
    assert boundaries.plan(rows, "2.13.0") == {}
    assert "5.5.0" in boundaries.firsts() and "5.5.4" not in boundaries.firsts()


def test_a_release_broken_with_hotfix_must_be_declared_lost_and_a_lost_one_measured_broken():
    """The gate on ``Mechanism.lost``: broken with hotfix inside the range without a Lost declaration (hotfix status
    would say APPLIED and nothing more) is a disagreement; so is a Lost release measured fine with hotfix."""
    from hotfix.patch import Lost, Mechanism

    def row(release, hotfix, verdict):
        return {"dimension": "transformers", "torch": "2.13.0", "mechanism": "m", "release": release,
                "hotfix": hotfix, "verdict": verdict}

    rows = [row("5.5.1", False, "wrong"), row("5.5.1", True, "wrong"),
            row("5.5.2", False, "wrong"), row("5.5.2", True, "equal")]

    def fix(lost):
        return type("Fix", (), {"mechanisms": (Mechanism("m", {"transformers": ">=5.0.0"}, lost=lost),)})()

    assert gates.problems(rows, [fix((Lost({"transformers": ">=5.5.0,<5.5.2"}, "why"),))]) == []
    assert any("5.5.1" in p and "does not declare it lost" in p for p in gates.problems(rows, [fix(())]))
    found = gates.problems(rows, [fix((Lost({"transformers": ">=5.5.0,<5.5.3"}, "why"),))])
    assert any("5.5.2" in p and "declared lost upstream, but measured fine with hotfix" in p for p in found), found


def test_the_lost_gate_holds_per_model_where_a_declaration_names_its_models():
    """A Gemma-4 cell broken with hotfix is not excused by Gemma-3n's declaration, and Gemma-4's declaration is not
    satisfied by Gemma-3n's broken cells: each model's cells answer for its own."""
    from hotfix.patch import Lost, Mechanism

    def row(release, case, hotfix, verdict):
        return {"dimension": "transformers", "torch": "2.13.0", "mechanism": "m", "release": release, "case": case,
                "hotfix": hotfix, "verdict": verdict}

    def fix(*lost):
        return type("Fix", (), {"mechanisms": (Mechanism("m", {"transformers": ">=5.0.0"}, lost=lost),)})()

    gemma3n = Lost({"transformers": ">=5.0.0,<5.6.0"}, "3n", ("gemma3n_text",))
    gemma4 = Lost({"transformers": ">=5.5.0,<5.5.2"}, "4", ("gemma4",))
    rows = [row("5.5.1", case, hotfix, "wrong") for case in ("gemma3n_text+cache/full", "gemma4+kv_shared_cache/full")
            for hotfix in (False, True)]
    assert gates.problems(rows, [fix(gemma3n, gemma4)]) == []
    found = gates.problems(rows, [fix(gemma3n)])
    assert found == ["m: transformers 5.5.1 (torch 2.13.0) is broken with hotfix (gemma4), but the mechanism does not "
                     "declare it lost there (hotfix status would not say NOT COVERED)"], found
    rows = [r if "gemma3n" in r["case"] or not r["hotfix"] else dict(r, verdict="equal") for r in rows]
    found = gates.problems(rows, [fix(gemma3n, gemma4)])
    assert found == ["m: transformers 5.5.1 (torch 2.13.0) is declared lost upstream for gemma4, but measured fine "
                     "with hotfix"], found


def test_where_two_lost_declarations_hold_one_release_a_cell_gets_the_reason_of_its_own_model():
    """Gemma-3n (5.0 - 5.5) and Gemma-4 (5.5.0 - 5.5.1) both lose their shared keys/values on 5.5.0: the page's
    reason for a Gemma-4 cell is Gemma-4's (it printed Gemma-3n's, the first declaration holding the release)."""
    fixes = gates.builtin_fixes()
    gemma4 = gates.lost_reason("shared-mapping", "transformers", "5.5.0", fixes, cells.model_type_of("gemma4+kv_shared_cache/full"))
    gemma3n = gates.lost_reason("shared-mapping", "transformers", "5.5.0", fixes, cells.model_type_of("gemma3n_text+cache/full"))
    assert gemma4.startswith("Gemma-4 ") and gemma3n.startswith("Gemma-3n "), (gemma4, gemma3n)
    assert gates.lost_reason("shared-mapping", "transformers", "5.3.0", fixes, "gemma4") is None  # Gemma-3n's only
    page = (REPO / "docs" / "versions.md").read_text()
    lines = [line for line in page.splitlines() if line.startswith("- transformers 5.5.0 ") and "gemma4+" in line]
    assert lines and all("Why: declared lost upstream (`hotfix status` says NOT COVERED): Gemma-4 " in line
                         for line in lines), lines


def test_no_cell_of_the_versions_page_is_without_a_verdict():
    """The page as committed: every cell of every table has a verdict.  The row checks above count rows by
    key; a torch line's rows once replaced a release's own (same key), and only the page showed the release
    row "not measured"."""
    page = (REPO / "docs" / "versions.md").read_text()
    assert "not measured" not in page, [line[:120] for line in page.splitlines() if "not measured" in line][:5]
