"""DeepSpeed ZeRO-2 / ZeRO-3 with gradient checkpointing, without and with hotfix (issue 42, part 1: CI's subset).

hotfix_lab.cases.deepspeed_cases (never mentions hotfix) runs under torchrun, 2 ranks, gloo on 127.0.0.1, DeepSpeed's CPU
accelerator (``DS_ACCELERATOR=cpu``), DeepSpeed 0.19.8 from tests/matrix.txt (its sdist, ``DS_BUILD_OPS=0``: no C++
op built), torch 2.13.0, transformers 4.56.2.  Each case trains through ``deepspeed.initialize`` twice, the same
seed: without checkpointing, and with transformers' checkpointing in that mode; every trainable parameter's full
gradient (``safe_get_full_grad``, gathered across ranks) after the first backward and every parameter after two
steps are compared (a parameter without gradient equals only one without).

* tiny Whisper, every parameter, reentrant (its decoder's ``encoder_hidden_states=`` by keyword: the seed bug):
  upstream "Trying to backward through the graph a second time" under ZeRO-2 and ZeRO-3; with hotfix equal;
* tiny Whisper, LoRA without the input hook, reentrant (no layer input needs grad): upstream the loss has no
  ``grad_fn`` (DeepSpeed: "loss must be a scalar tensor"); with hotfix equal;
* tiny Llama, LoRA (input hook) and full, reentrant and non-reentrant: equal with hotfix (upstream too: measured
  here for ZeRO-3 LoRA non-reentrant; the rest, tools/hotfix_lab/cases/deepspeed_cases.py by hand, 2026-11-28);
* non-reentrant Whisper: equal both ways;
* transformers' Seq2SeqTrainer with a ZeRO-3 ``deepspeed`` config (DeepSpeed's AdamW), tiny Whisper, reentrant:
  upstream the seed bug; with hotfix its losses and every parameter after two steps equal the Trainer without
  checkpointing;
* DeepSpeed's own ``deepspeed.checkpointing.checkpoint`` as the layers' checkpoint function (transformers'
  ``_set_gradient_checkpointing``), tiny Whisper full and LoRA: upstream the layer's ``(hidden_states,)`` comes back
  bare ("not enough values to unpack"); with hotfix (deepspeed-checkpoint-layer-io, with the keyword and
  frozen-input repairs, which DeepSpeed's function needs as torch's reentrant one does) equal;
* a tiny Qwen3-MoE with the drift device of hotfix_lab.cases.moe_cases (a GPU's drift in the recomputation), its sparse
  block a ZeRO-3 leaf (``set_z3_leaf_modules``, as transformers' DeepSpeed docs ask of a MoE), 4 rows per rank so
  both ranks reach the same experts: upstream reentrant trains with wrong gradients (8 of 69 equal, 2026-11-29),
  non-reentrant "different metadata"; with hotfix (moe-routing-replay) 69/69 and every parameter equal.

DeepSpeed 0.19.2 (before its own fix of ZeRO-3 + non-reentrant checkpointing with frozen parameters): upstream that
CheckpointError ("Recomputed values ... different metadata": Llama LoRA, Whisper LoRA, and through the Trainer); with
hotfix (deepspeed-zero3-frozen-recompute) every gradient and parameter equal, as is reentrant checkpointing with
hotfix (the workaround before the fix).

The upstream launches are recorded (tests/evidence/deepspeed.json, support/evidence.py: keyed by the releases, torch
and the cases' code; each measured again every few commits, and wherever its key changed).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version as installed

import pytest
import torch  # its release names DeepSpeed's extensions folder (the children run this venv's torch)

from conftest import launch_ranks, matrix_path, repair_notices
from hotfix_lab.infra import deepspeed_env
from support import evidence

DEEPSPEED = "0.19.8"
BACKWARD_TWICE = "Trying to backward through the graph a second time"
NO_GRAD_FN = "loss must be a scalar tensor"
TUPLE_OF_ONE = "not enough values to unpack"  # DeepSpeed's checkpoint hands Whisper's (hidden_states,) back bare
METADATA = "different metadata"  # torch's non-reentrant checkpoint: the recomputation saved other tensors
WRONG = "gradients differ"  # upstream trains, silently wrong
#: case -> what upstream does (None: trains equal; WRONG: trains with other gradients; else its error)
CASES = {
    "zero2:whisper:reentrant": BACKWARD_TWICE,
    "zero3:whisper:reentrant": BACKWARD_TWICE,
    "zero3:whisper-lora:reentrant": NO_GRAD_FN,
    "zero3:whisper:nonreentrant": None,
    "zero3:lora:reentrant": None,
    "zero3:lora:nonreentrant": None,
    "zero2:full:reentrant": None,
    "trainer-zero3:whisper:reentrant": BACKWARD_TWICE,
    # DeepSpeed's own deepspeed.checkpointing.checkpoint as the layers' checkpoint function (issue 42, part 4)
    "zero3:whisper:deepspeed": TUPLE_OF_ONE,
    "zero3:whisper-lora:deepspeed": TUPLE_OF_ONE,
    # a tiny Qwen3-MoE with hotfix_lab.cases.moe_cases's drift device (routers tied, scaled apart by 1e-6 in the
    # recomputation only: a GPU's drift), its sparse block a ZeRO-3 leaf module (issue 51: moe-routing-replay)
    "zero3:moe:reentrant": WRONG,
    "zero3:moe:nonreentrant": METADATA,
}
TIMEOUT_S = 600
#: the last release before DeepSpeed's own fix (0.19.3, deepspeedai/DeepSpeed#8148) of ZeRO-3 + non-reentrant
#: checkpointing with frozen parameters; case -> what it does with hotfix (None: trains equal)
BEFORE_FIX = "0.19.2"
FROZEN_PARAMETER_ERROR = "Recomputed values for the following tensors have different metadata"
CASES_BEFORE_FIX = {
    "zero3:lora:nonreentrant": FROZEN_PARAMETER_ERROR,
    "zero3:whisper-lora:nonreentrant": FROZEN_PARAMETER_ERROR,
    "zero3:lora:reentrant": None,  # the workaround before hotfix repaired the rest
    "zero3:whisper-lora:reentrant": None,  # the same, where reentrant needs hotfix's frozen-inputs repair
}


def torchrun(folder, *, disabled, deepspeed=DEEPSPEED, cases=tuple(CASES)):
    """2 ranks of tools/hotfix_lab/cases/deepspeed_cases.py over ``cases``; ({rank: result}, stderr)."""
    release = matrix_path("deepspeed", deepspeed)
    results, proc = launch_ranks(folder, "hotfix_lab.cases.deepspeed_cases", cases, disabled=disabled,
                                 env=deepspeed_env.cpu_env(release, torch.__version__), pythonpath=[release],
                                 timeout=TIMEOUT_S)
    return results, proc.stderr


#: what an upstream launch is made of (support/evidence.py adds the lab's infrastructure and the comparison rule)
GUARDS = ("tools/hotfix_lab/cases/deepspeed_cases.py", "tools/hotfix_lab/cases/ddp_cases.py",
          "tools/hotfix_lab/cases/moe_cases.py", "tests/e2e/test_deepspeed.py")
KNOWN_ERRORS = (BACKWARD_TWICE, NO_GRAD_FN, TUPLE_OF_ONE, METADATA, FROZEN_PARAMETER_ERROR)


def _facts(launch):
    """What a re-measured upstream launch must agree on: per rank, what ran, and each case's verdict and the known
    error it raised; the repair notices (none)."""
    results, notices = launch
    return {"notices": notices, "ranks": {rank: {
        "ran": [result["hotfix_loaded"], result["deepspeed"], result["world"]],
        "cases": {case: [found.get("ok"), found.get("equal"), found.get("params_equal"), bool(found.get("wrong")),
                         [error for error in KNOWN_ERRORS if error in found.get("error", "")]]
                  for case, found in sorted(result["cases"].items())}} for rank, result in sorted(results.items())}}


def upstream_launch(folder, deepspeed, cases):
    """An upstream launch (HOTFIX_DISABLE=1): recorded (tests/support/evidence.py), its stderr kept as its repair
    notices, what the tests read of it."""
    def measure():
        results, stderr = torchrun(folder, disabled=True, deepspeed=deepspeed, cases=cases)
        return results, "\n".join(repair_notices(stderr))

    parts = {"deepspeed": deepspeed, "torch": installed("torch"), "transformers": installed("transformers"),
             "cases": list(cases)}
    return evidence.upstream("deepspeed", deepspeed, parts, GUARDS, measure, _facts)


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepspeed")
    with ThreadPoolExecutor(2) as pool:
        # upstream: the failing cases, and one that trains equal (CI's time: the rest is equal both ways, measured)
        upstream = pool.submit(upstream_launch, folder / "upstream", DEEPSPEED,
                               tuple(c for c, failure in CASES.items() if failure) + ("zero3:lora:nonreentrant",))
        fixed = pool.submit(torchrun, folder / "hotfix", disabled=False)
        before = pool.submit(torchrun, folder / "before-fix", disabled=False, deepspeed=BEFORE_FIX,
                             cases=tuple(CASES_BEFORE_FIX))
        before_upstream = pool.submit(upstream_launch, folder / "before-fix-upstream", BEFORE_FIX,
                                      tuple(c for c, failure in CASES_BEFORE_FIX.items() if failure))
        return {"upstream": upstream.result(), "hotfix": fixed.result(), "before-fix": before.result(),
                "before-fix-upstream": before_upstream.result()}


def test_upstream_whisper_fails_under_zero_2_and_3_and_the_rest_trains_equal(launches):
    results, stderr = launches["upstream"]
    for rank, result in results.items():
        assert result["hotfix_loaded"] is False and result["deepspeed"] == DEEPSPEED and result["world"] == 2
        assert len(result["cases"]) == sum(1 for failure in CASES.values() if failure) + 1
        for case, found in result["cases"].items():
            if CASES[case] is None:
                assert found["ok"] and found["equal"] and found["params_equal"], (rank, case, found)
            elif CASES[case] is WRONG:
                assert found["ok"] and not found["equal"] and found["wrong"], (rank, case, found)
            else:
                assert not found["ok"] and CASES[case] in found["error"], (rank, case, found)
    assert repair_notices(stderr) == []


def test_with_hotfix_every_gradient_and_parameter_equals_the_same_stage_without_checkpointing(launches):
    results, stderr = launches["hotfix"]
    for rank, result in results.items():
        assert result["hotfix_loaded"] is True
        for case in CASES:
            found = result["cases"][case]
            assert found["ok"] and found["equal"] and found["missing"] == 0, (rank, case, found)
            assert found["params_equal"], (rank, case, found["params_summary"])
    said = "\n".join(repair_notices(stderr))
    assert "transformers-checkpoint-layer-io" in said and "transformers-frozen-inputs" in said, said
    assert "deepspeed-checkpoint-layer-io" in said and "moe-routing-replay" in said, said


def test_before_deepspeeds_own_fix_zero3_non_reentrant_with_frozen_parameters_fails_upstream(launches):
    """DeepSpeed 0.19.2, ZeRO-3, LoRA (frozen base parameters), non-reentrant: torch's recomputation saves a frozen
    parameter as itself and ZeRO-3 partitions it after the recomputed forward ("Recomputed values ... different
    metadata")."""
    results, stderr = launches["before-fix-upstream"]
    for rank, result in results.items():
        assert result["hotfix_loaded"] is False and result["deepspeed"] == BEFORE_FIX
        for case, failure in CASES_BEFORE_FIX.items():
            if failure:
                found = result["cases"][case]
                assert not found["ok"] and failure in found["error"], (rank, case, found)
    assert repair_notices(stderr) == []


def test_before_deepspeeds_own_fix_hotfix_trains_every_case_equal(launches):
    """The same cases with hotfix (deepspeed-zero3-frozen-recompute: the frozen parameters saved as aliases of their
    gathered data), and reentrant checkpointing with hotfix (the workaround before that fix; Whisper LoRA without
    the input hook, which reentrant checkpointing alone leaves without gradients): every gradient and parameter
    equal to ZeRO-3 without checkpointing."""
    results, stderr = launches["before-fix"]
    for rank, result in results.items():
        assert result["hotfix_loaded"] is True and result["deepspeed"] == BEFORE_FIX
        for case in CASES_BEFORE_FIX:
            found = result["cases"][case]
            assert found["ok"] and found["equal"] and found["missing"] == 0, (rank, case, found)
            assert found["params_equal"], (rank, case, found["params_summary"])
    said = "\n".join(repair_notices(stderr))
    assert "deepspeed-zero3-frozen-recompute" in said, said


def test_from_deepspeeds_own_fix_on_hotfix_leaves_zero3_to_it(launches):
    """DeepSpeed 0.19.8 has its own fix: hotfix's is not applied there (the same cases train equal, above), and never
    says it repaired one."""
    results, stderr = launches["hotfix"]
    assert "deepspeed-zero3-frozen-recompute" not in "\n".join(repair_notices(stderr))
