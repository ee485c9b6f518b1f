"""What a user sees from hotfix with no logging set up (hotfix/notice.py).

``HOTFIX_LOG_LEVEL=INFO`` used to print nothing in a script that configures
logging only after its imports, as HF's example scripts do.  By default
hotfix prints one line per fix that repaired something, once per job:
``HOTFIX_LOG_LEVEL=WARNING`` silences it; torchrun ranks other than 0 stay
quiet, and of the processes ``torch.multiprocessing.spawn`` starts (no
``RANK``) only the first to repair speaks.  A fix that changed nothing that
mattered says nothing (tests/e2e/test_repair_truth.py walks the cases).
"""

from __future__ import annotations

import os
import textwrap

import pytest

from conftest import (REPAIR_NOTICE, SUPPORT, hotfix_lines, json_lines, matrix_path, repair_notices,
                      run_python)

# A user script: no logging setup before training (optionally basicConfig after its imports).
SCRIPT = textwrap.dedent(
    """
    import json, logging, sys
    import torch, transformers
    from hotfix_lab.infra import tiny_models
    if "--basic-config" in sys.argv:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    model, batch = tiny_models.whisper(0)
    model.gradient_checkpointing_enable()
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
    print(json.dumps({"trained": True}))
    """
)


def _run(env=None, *args):
    proc = run_python(["-c", SCRIPT, *args], env=env, timeout=300)
    assert json_lines(proc.stdout) == [{"trained": True}], proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if line.startswith("hotfix:")]


def test_default_is_one_line_saying_what_was_repaired():
    lines = _run()
    assert len(lines) == 1 and lines[0].startswith(REPAIR_NOTICE), lines
    assert "transformers-checkpoint-layer-io" in lines[0] and "huggingface/transformers#38913" in lines[0], lines


def test_log_level_info_works_without_any_logging_setup():
    lines = _run({"HOTFIX_LOG_LEVEL": "INFO"})
    applied = [l for l in lines if l.startswith("hotfix: applied ")]
    assert any("transformers-checkpoint-layer-io to transformers.modeling_layers" in l for l in applied), lines
    assert any("transformers-frozen-inputs to transformers.modeling_utils" in l for l in applied), lines
    assert len([l for l in lines if l.startswith(REPAIR_NOTICE)]) == 1, lines


def test_log_level_info_with_a_late_basic_config_prints_each_line_once():
    lines = _run({"HOTFIX_LOG_LEVEL": "INFO"}, "--basic-config")
    assert len(lines) == len(set(lines)) and len(lines) >= 3, lines


@pytest.mark.parametrize("env", [{"HOTFIX_LOG_LEVEL": "WARNING"}, {"HOTFIX_LOG_LEVEL": "error"}, {"RANK": "1"},
                                 {"LOCAL_RANK": "3"}])
def test_silenced_and_non_zero_ranks_print_nothing(env):
    assert _run(env) == []


def test_rank_zero_prints_the_line():
    lines = _run({"RANK": "0", "LOCAL_RANK": "0"})
    assert len(lines) == 1 and hotfix_lines("\n".join(lines)) == [], lines


def test_a_fix_opted_out_leaves_a_wrong_run_without_any_repaired_line():
    """Issue 31: Llava + LoRA on every q/v + enable_input_require_grads(), reentrant.  transformers-frozen-inputs
    repairs the vision tower's adapters; opted out, the run is silently wrong (as upstream), and no fix may say
    "repaired" (the input-grads-leaf fix said it, for a copy that changed nothing)."""
    proc = run_python([str(SUPPORT / "repair_walk.py"), "llava-lora:reentrant"],
                      env={"HOTFIX_DISABLED_PATCHES": "transformers-frozen-inputs", "OMP_NUM_THREADS": "1"},
                      pythonpath=[matrix_path("transformers", "4.56.2")], timeout=300)
    (result,) = json_lines(proc.stdout) or [proc.stderr[-2000:]]
    assert result["status"] == "wrong" and result["missing"] > 0, result
    assert repair_notices(proc.stderr) == [], proc.stderr[-2000:]


# torch.multiprocessing.spawn: no RANK; the children share the parent's multiprocessing authkey (the job).
SPAWN_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.multiprocessing as mp

    def train(index):
        from hotfix_lab.infra import tiny_models
        torch.set_num_threads(1)
        model, batch = tiny_models.whisper(0)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model(**batch).loss.backward()
        print(json.dumps({"trained": index}), flush=True)

    if __name__ == "__main__":
        mp.spawn(train, nprocs=2)
        from hotfix.notice import job_folder  # the parent's authkey is its children's: their job's claims
        print(json.dumps({"claims": sorted(os.listdir(job_folder())), "folder": job_folder()}))
    """
)


def test_spawned_processes_of_one_job_say_each_line_once(tmp_path):
    script = tmp_path / "spawn_train.py"
    script.write_text(SPAWN_SCRIPT)
    proc = run_python([str(script)], env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json_lines(proc.stdout)
    assert sorted(r["trained"] for r in results if "trained" in r) == [0, 1], proc.stdout + proc.stderr[-2000:]
    lines = repair_notices(proc.stderr)
    assert len(lines) == 1 and "transformers-checkpoint-layer-io" in lines[0], lines
    (job,) = [r for r in results if "claims" in r]
    assert len(job["claims"]) == 1, job  # one child claimed the line; its sibling found the claim
    assert not os.path.exists(job["folder"]), job  # the job's first process took the claims away at its exit


ENDS_WITHOUT_ATEXIT = textwrap.dedent(
    """
    import json, os, sys
    from hotfix.notice import job_folder, repair_notice
    repair_notice.say("some-fix", "a test", "upstream#0")
    print(json.dumps({"folder": job_folder()}), flush=True)
    os._exit(0)  # no atexit: the job folder stays behind
    """
)


def test_a_job_that_ends_without_atexit_leaves_its_folder_to_the_next_job(tmp_path):
    """Processes ending by ``os._exit`` or a kill (multiprocessing children, some launchers) left their
    ``hotfix-notice-*`` folder for good (40 after a day of test runs).  The next job's first claim removes a
    leftover whose claimants all ended and that is a minute old; a live job's folder is never touched."""
    env = {"TMPDIR": str(tmp_path)}
    first = run_python(["-c", ENDS_WITHOUT_ATEXIT], env=env, timeout=120)
    (left,) = [r["folder"] for r in json_lines(first.stdout)]
    assert os.path.isdir(left), first.stderr
    os.utime(left, (os.path.getmtime(left) - 120,) * 2)  # a minute and more ago
    live = tmp_path / "hotfix-notice-live"
    live.mkdir(mode=0o700)
    (live / "claim").write_text(str(os.getpid()))  # this test's own process: alive
    os.utime(live, (os.path.getmtime(live) - 120,) * 2)
    second = run_python(["-c", ENDS_WITHOUT_ATEXIT], env=env, timeout=120)
    (mine,) = [r["folder"] for r in json_lines(second.stdout)]
    assert mine != left and os.path.isdir(mine)
    assert not os.path.exists(left), "the ended job's folder is still there"
    assert live.is_dir(), "a live job's folder was removed"
