"""transformers-ddp-find-unused on transformers 5.23.0 and unsloth-zoo 2025.11.3, one DDP rank each (gloo, loopback).

DDP's unused-parameter search and its "ready" marks are local to a rank: one rank
(tools/hotfix_lab/cases/ddp_cases.py with WORLD_SIZE=1) shows the defect.  transformers 5.23.0
(``GradientCheckpointingLayer``'s ``partial(forward, self)``; 4.56.2 runs in e2e/test_ddp_find_unused.py;
every other release of the matrix is in docs/fixes/transformers-ddp-find-unused.md), torch's and
unsloth-zoo's checkpoint function: upstream DDP's error, with hotfix every LoRA gradient equal to DDP
without checkpointing.  And unsloth-zoo 2025.11.3, whose own
backward returns gradients only when its first input needs grad, with the two fixes that otherwise
take care of that opted out: Whisper's encoder layers (no input needing grad) still train, the
parameters going in behind a 0-byte anchor put first.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from conftest import DDP_WARM, launch_ranks, matrix_path

FIND_UNUSED = "Expected to mark a variable ready only once"
CASES = ["lora", "unsloth:lora"]


def one_rank(folder, transformers, zoo, cases, env=None):
    results, _ = launch_ranks(folder, "hotfix_lab.cases.ddp_cases", cases, 1, env=env,
                              pythonpath=[matrix_path("transformers", transformers), matrix_path("unsloth-zoo", zoo)],
                              warm=DDP_WARM)
    return results[0]


def test_upstream_fails_and_hotfix_trains_on_5_23(tmp_path):
    transformers = "5.23.0"
    with ThreadPoolExecutor(2) as pool:
        upstream, fixed = pool.map(
            lambda disabled: one_rank(tmp_path / f"disabled{disabled}", transformers, "2026.10.9", CASES,
                                      env={"HOTFIX_DISABLE": "1"} if disabled else None), (True, False))
    assert upstream["transformers"] == fixed["transformers"] == transformers
    assert upstream["hotfix_loaded"] is False and fixed["hotfix_loaded"] is True
    for name in CASES:
        case = upstream["cases"][name]
        assert not case["ok"] and FIND_UNUSED in case["error"], (name, case)
        case = fixed["cases"][name]
        assert case["ok"] and case["equal"] and case["missing"] == 0 and case["trainable"] == 8, (name, case)


def test_first_input_rule_of_unsloth_zoo_2025_11_3(tmp_path):
    opted_out = {"HOTFIX_DISABLED_PATCHES": "unsloth-zoo-offload-backward,transformers-frozen-inputs"}
    result = one_rank(tmp_path / "hotfix", "4.56.2", "2025.11.3", ["unsloth:whisper-lora"], env=opted_out)
    case = result["cases"]["unsloth:whisper-lora"]
    assert case["ok"] and case["equal"] and case["missing"] == 0 and case["trainable"] == 24, case
