"""What a user sees from hotfix with no logging set up (hotfix/notice.py).

``HOTFIX_LOG_LEVEL=INFO`` used to print nothing in a script that configures
logging only after its imports, as HF's example scripts do.  By default
hotfix now prints exactly one line per process, the first time it repairs a
checkpointed call; ``HOTFIX_LOG_LEVEL=WARNING`` silences it; torchrun ranks
other than 0 stay quiet.
"""

from __future__ import annotations

import textwrap

import pytest

from conftest import REPAIR_NOTICE, hotfix_lines, json_lines, run_python

# A user script: no logging setup before training (optionally basicConfig after its imports).
SCRIPT = textwrap.dedent(
    """
    import json, logging, sys
    import torch, transformers
    import tiny_models
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
