"""A torch-only script under DDP(find_unused_parameters=True), hotfix installed, no `import hotfix` (issue 50, part 4).

torch-ddp-find-unused repairs torch's reentrant checkpoint entered directly under DDP with find_unused_parameters
("Expected to mark a variable ready only once"), but a script importing torch and no transformers never activated
hotfix.  Now the start-up hook watches torch's DistributedDataParallel.__init__ once torch is imported (a plain
function on the class, no import): the first DDP built activates hotfix, and torch's own __init__ goes back."""

from __future__ import annotations

from conftest import SUPPORT, launch_ranks, repair_notices, run_python

SCRIPT = SUPPORT / "torch_only_ddp.py"


def test_torch_only_ddp_trains_equal_with_hotfix_installed(tmp_path):
    upstream, _ = launch_ranks(tmp_path / "up", SCRIPT, ranks=2, disabled=True)
    fixed, proc = launch_ranks(tmp_path / "hf", SCRIPT, ranks=2)
    for rank in (0, 1):
        assert upstream[rank]["hotfix_after"] is False
        assert "ready only once" in upstream[rank]["cases"]["blocks"].get("error", ""), upstream[rank]
        seen = fixed[rank]
        assert seen["transformers_loaded"] is False and seen["hotfix_before_ddp"] is False, seen
        assert seen["hotfix_after"] is True, seen
        case = seen["cases"]["blocks"]
        assert case["ok"] and case["equal"] and case["missing"] == 0, case
    assert any("torch-ddp-find-unused" in line for line in repair_notices(proc.stderr)), proc.stderr[-2000:]


def test_the_watch_leaves_torch_alone_until_a_ddp_is_built_and_then_goes():
    probe = ("import sys, torch; from torch.nn.parallel import DistributedDataParallel as D; "
             "watched = D.__init__.__qualname__; "
             "import transformers; print(watched, '|', D.__init__.__qualname__, '|', 'hotfix' in sys.modules)")
    proc = run_python(["-c", probe], timeout=120)
    watched, after, active = (part.strip() for part in proc.stdout.strip().split("|"))
    assert watched.endswith("watch_ddp.<locals>.__init__"), proc.stdout + proc.stderr
    assert after == "DistributedDataParallel.__init__" and active == "True", proc.stdout  # a trigger: watch gone
    plain = run_python(["-c", "import sys, torch; print('hotfix' in sys.modules)"], timeout=120)
    assert plain.stdout.strip() == "False"  # importing torch activates nothing
