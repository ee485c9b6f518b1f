"""``hotfix_state``: a read-only answer, in the user's own process, to "is hotfix active here, which fixes?".

``import hotfix`` activates hotfix and ``hotfix status`` runs in a process of its own, so neither can say whether
a script that never imported hotfix got its fixes (issue 50: TRL-first scripts ran with every fix off while
``hotfix status`` said "active").  The wheel ships ``hotfix_state`` at the root of site-packages; asking it
imports nothing of hotfix.
"""

from __future__ import annotations

from conftest import FINDER, WATCH, hotfix_lines, run_child, run_python

ASK = """
    import hotfix_state
    first = (hotfix_state.active(), hotfix_state.report(), "hotfix" in sys.modules)
    {between}
    report(first=first, active=hotfix_state.active(), applied=hotfix_state.applied(), report=hotfix_state.report(),
           hotfix_imported="hotfix" in sys.modules)
"""


def test_before_and_after_the_first_import_of_transformers():
    proc, seen = run_child(ASK.format(between="import transformers.modeling_utils"))
    active, said, imported = seen["first"]
    assert (active, imported) == (False, False)  # asking activated nothing
    assert said.startswith("hotfix is not active in this process yet: its start-up hook activates it at the first "
                           "import of transformers"), said
    assert seen["active"] is True and seen["hotfix_imported"] is True
    assert seen["applied"]["transformers-checkpoint-layer-io"] == ["transformers.modeling_utils"]
    assert seen["report"].startswith("hotfix is active in this process (pid "), seen["report"]
    assert "transformers-checkpoint-layer-io" in seen["report"]


def test_disabled():
    proc, seen = run_child(ASK.format(between="import transformers.modeling_utils"), env={"HOTFIX_DISABLE": "1"})
    assert seen["active"] is False and seen["applied"] == {} and seen["hotfix_imported"] is False
    assert seen["report"] == "hotfix is NOT active in this process: HOTFIX_DISABLE=1"


def test_no_start_up_finder():
    """The finder taken out of sys.meta_path (as where no start-up hook ran): NOT active, and the remedy."""
    remove = (f"sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ not in {(WATCH, FINDER)!r}]; "
              "import transformers")
    proc, seen = run_child(ASK.format(between=remove))
    assert seen["active"] is False and seen["hotfix_imported"] is False
    assert seen["report"].startswith("hotfix is NOT active in this process: its start-up finder is not in "
                                     "sys.meta_path"), seen["report"]
    assert "add `import hotfix`" in seen["report"]


def test_info_says_one_line_at_activation():
    proc = run_python(["-c", "import transformers"], env={"HOTFIX_LOG_LEVEL": "INFO"}, timeout=120)
    lines = [line for line in hotfix_lines(proc.stderr) if "active in this process" in line]
    assert len(lines) == 1 and "fixes, each applied when its target is imported" in lines[0], proc.stderr
