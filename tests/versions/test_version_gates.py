"""The ranges each fix declares equal the census's evidence (issue 26), from the committed rows.

docs/census/ holds the rows of tools/census/census.py (every transformers minor line 4.35 - 5.23 and
every unsloth-zoo release since 2024.11.6, without and with hotfix); nothing is re-run here.
tools/census/gates.py says what "equal to the evidence" means; this test fails on any disagreement,
and when a release the census should cover has no rows.
"""

from __future__ import annotations

import json
import sys

from conftest import REPO, TOOLS

sys.path[:0] = [str(TOOLS / "census"), str(TOOLS / "sweep")]
import cells  # noqa: E402
import gates  # noqa: E402
import releases  # noqa: E402
import render  # noqa: E402
import sweep_store  # noqa: E402

STORE = REPO / "docs" / "census"


def _rows():
    return [json.loads(line) for line in sweep_store.read_lines(STORE)]


#: the torch releases the census measures every release under (both on this machine's disk)
TORCHES = ("2.13.0", "2.14.1")


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


def test_every_cell_broken_with_hotfix_says_why():
    """A cell that stays broken with hotfix is published with its reason (tools/census/cells.py), never bare."""
    broken = {(r["case"], r["release"]) for r in _rows() if r["hotfix"] and r["verdict"] in render.BROKEN}
    assert sorted(broken - set(cells.BROKEN_WITH_HOTFIX)) == []


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
