"""moe-routing-replay at the call sites beside transformers' function: unsloth-zoo's and DeepSpeed's checkpoint
functions, torch's checkpoint_wrapper (REENTRANT, NO_REENTRANT); DDP and FSDP2 (one gloo rank).

The drifted plain-torch MoE of tests/support/moe_block.py (routers tied, scaled by 1 +- 1e-6 during the
recomputation only) checkpointed through each site (tests/support/moe_call_sites.py), in a child without hotfix and
one with it: upstream wrong gradients or a CheckpointError, with hotfix every gradient equal to the step without
checkpointing (1e-4).  unsloth-zoo 2025.11.3 loaded on CPU; DeepSpeed 0.19.8, one gloo rank; DDP and FSDP2 with
torch's non-reentrant checkpoint (fully_shard: torch >= 2.6).  And unsloth-zoo's fused MoE router (2026.10.9, on
transformers 5.24.0's models through hotfix_lab.cases.zoo_moe, its Triton kernel a CPU stand-in) and its own Qwen3-MoE
block forward.  The upstream children are recorded (tests/evidence/moe-routing-call-sites.json, support/evidence.py).
"""

from __future__ import annotations

from importlib.metadata import version as installed

import pytest

from conftest import SUPPORT, free_port, json_lines, matrix_path, run_python
from support import evidence

RECORD = "moe-routing-call-sites"
#: what an upstream child is made of (support/evidence.py adds the lab's infrastructure and the comparison rule)
GUARDS = ("tests/support/moe_call_sites.py", "tests/support/moe_block.py", "tools/hotfix_lab/cases/moe_cases.py",
          "tools/hotfix_lab/cases/zoo_moe.py", "tests/versions/test_moe_routing_call_sites.py")

SITES = {"unsloth": ("unsloth-zoo", "2025.11.3"), "deepspeed": ("deepspeed", "0.19.8"),
         "wrapper-reentrant": None, "wrapper-no-reentrant": None, "ddp": None, "fsdp2": None}


@pytest.mark.parametrize("site", sorted(SITES))
def test_each_call_site_replays_the_forward_routing(site):
    release = SITES[site]
    pythonpath = [matrix_path(*release)] if release else []

    def run(hotfix):
        proc = run_python([str(SUPPORT / "moe_call_sites.py"), site, str(free_port())], pythonpath=pythonpath,
                          env={"OMP_NUM_THREADS": "1", **({} if hotfix else {"HOTFIX_DISABLE": "1"})}, timeout=300)
        lines = json_lines(proc.stdout)
        assert lines, proc.stderr[-3000:]
        return lines[-1]

    parts = {"site": site, "release": list(release or ()), "torch": installed("torch")}
    results = {False: evidence.upstream(RECORD, site, parts, GUARDS, lambda: run(False), lambda r: r["status"]),
               True: run(True)}
    assert results[False]["status"] in ("differs", "crash"), results[False]
    assert results[True]["status"] == "equal", results[True]


#: transformers 5.24.0's router forms the release's fused router takes over: softmax then top-k (Qwen3-MoE), top-k
#: then softmax (gpt-oss), sigmoid with groups (DeepSeek-V3)
FUSED_CASES = ("qwen3_moe:reentrant", "qwen3_moe:non-reentrant", "gpt_oss:reentrant", "deepseek_v3:non-reentrant")


def _zoo_moe(flags, cases, env):
    pythonpath = [matrix_path("transformers", "5.24.0"), matrix_path("unsloth-zoo", "2026.10.9")]
    proc = run_python(["-P", "-m", "hotfix_lab.cases.zoo_moe", *flags, *cases],
                      pythonpath=pythonpath, env={"OMP_NUM_THREADS": "1", **env}, timeout=600)
    lines = json_lines(proc.stdout)
    assert len(lines) == len(cases) + ("--fused-router" in flags), proc.stderr[-3000:]
    return {line["case"]: line for line in lines}, proc.stderr


def _zoo_facts(run):
    """What a re-measured upstream zoo_moe child must agree on: each case's verdict, where its kernel ran, which
    forward it went through, its error's kind; the callers of the gate."""
    cases, _ = run
    return {case: [line.get("status"), line.get("kernel_recomputations"), line.get("block_forward"),
                   "CheckpointError" in line.get("error", ""), line.get("callers_eager_inside")]
            for case, line in sorted(cases.items())}


def _zoo_moe_upstream(flags, cases):
    """The upstream child (HOTFIX_DISABLE=1), recorded; its stderr is not read."""
    parts = {"flags": list(flags), "cases": list(cases), "transformers": "5.24.0", "unsloth-zoo": "2026.10.9",
             "torch": installed("torch")}
    cell = " ".join([*flags, *cases])
    return evidence.upstream(RECORD, cell, parts, GUARDS,
                             lambda: (_zoo_moe(flags, cases, {"HOTFIX_DISABLE": "1"})[0], ""), _zoo_facts)


def test_unsloth_fused_router_declines_inside_checkpointed_calls():
    """unsloth-zoo's fused router chooses the experts inside its kernel, again in the recomputation: upstream every
    case's gradients differ (the kernel ran in each recomputation); with hotfix the kernel runs only in the step
    without checkpointing, the model's eager router is replayed, every gradient equal, said once.  Activated after the
    release's modules imported the gate under their own names (--late), the same."""
    upstream, _ = _zoo_moe_upstream(["--fused-router"], FUSED_CASES)
    fixed, stderr = _zoo_moe(["--fused-router"], FUSED_CASES, {})
    late, _ = _zoo_moe(["--fused-router", "--late"], FUSED_CASES[:1], {"HOTFIX_DISABLE": "1"})
    for case in FUSED_CASES:
        assert upstream[case]["status"] == "differs" and upstream[case]["kernel_recomputations"] == 2, upstream[case]
        assert fixed[case]["status"] == "equal", fixed[case]
        # two routers: the kernel in the step without checkpointing only
        assert fixed[case]["kernel_calls"] == 2 and fixed[case]["kernel_recomputations"] == 0, fixed[case]
    callers = ["gpt_oss", "moe_grouped_modulelist", "qwen3_moe", "qwen3_vl_moe"]
    assert upstream["callers"]["callers_eager_inside"] == [], upstream["callers"]
    for run in (fixed, late):
        assert run["callers"] == {"case": "callers", "callers_fused_outside": callers, "callers_eager_inside": callers}
    assert late[FUSED_CASES[0]]["status"] == "equal" and late[FUSED_CASES[0]]["callers_on_the_gate"] == callers
    assert stderr.count("fused MoE router (UNSLOTH_MOE_FUSED_ROUTER=1) is not used inside checkpointed calls") == 1


def test_unsloth_zoo_block_forward_replays_the_forward_routing():
    """unsloth-zoo's own Qwen3-MoE sparse block forward (2026.10.9's ``patch_qwen3_moe``, its experts backend on CPU,
    transformers 5.24.0), with the drift device: upstream wrong gradients (reentrant) and a CheckpointError
    (non-reentrant: its experts run the experts that were hit); with hotfix every gradient equal."""
    cases = ("qwen3_moe:reentrant", "qwen3_moe:non-reentrant")
    upstream, _ = _zoo_moe_upstream(["--block-forwards"], cases)
    fixed, _ = _zoo_moe(["--block-forwards"], cases, {})
    for run in (upstream, fixed):
        assert all(run[case]["block_forward"] == "unsloth_zoo.temporary_patches.qwen3_moe" for case in cases), run
    assert upstream[cases[0]]["status"] == "differs", upstream
    assert upstream[cases[1]]["status"] == "crash" and "CheckpointError" in upstream[cases[1]]["error"], upstream
    assert all(fixed[case]["status"] == "equal" for case in cases), fixed
