"""moe-routing-replay at the call sites beside transformers' function: unsloth-zoo's and DeepSpeed's checkpoint
functions, torch's checkpoint_wrapper (REENTRANT, NO_REENTRANT); DDP and FSDP2 (one gloo rank).

The drifted plain-torch MoE of tests/support/moe_block.py (routers tied, scaled by 1 +- 1e-6 during the
recomputation only) checkpointed through each site (tests/support/moe_call_sites.py), in a child without hotfix and
one with it: upstream wrong gradients or a CheckpointError, with hotfix every gradient equal to the step without
checkpointing (1e-4).  unsloth-zoo 2025.11.3 loaded on CPU; DeepSpeed 0.19.8, one gloo rank; DDP and FSDP2 with
torch's non-reentrant checkpoint (fully_shard: torch >= 2.6).
"""

from __future__ import annotations

import pytest

from conftest import SUPPORT, free_port, json_lines, matrix_path, run_python

SITES = {"unsloth": ("unsloth-zoo", "2025.11.3"), "deepspeed": ("deepspeed", "0.19.8"),
         "wrapper-reentrant": None, "wrapper-no-reentrant": None, "ddp": None, "fsdp2": None}


@pytest.mark.parametrize("site", sorted(SITES))
def test_each_call_site_replays_the_forward_routing(site):
    release = SITES[site]
    pythonpath = [matrix_path(*release)] if release else []
    results = {}
    for hotfix in (False, True):
        proc = run_python([str(SUPPORT / "moe_call_sites.py"), site, str(free_port())], pythonpath=pythonpath,
                          env={"OMP_NUM_THREADS": "1", **({} if hotfix else {"HOTFIX_DISABLE": "1"})}, timeout=300)
        lines = json_lines(proc.stdout)
        assert lines, proc.stderr[-3000:]
        results[hotfix] = lines[-1]
    assert results[False]["status"] in ("differs", "crash"), results[False]
    assert results[True]["status"] == "equal", results[True]
