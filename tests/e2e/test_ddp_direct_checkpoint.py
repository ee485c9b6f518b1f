"""torch-ddp-find-unused: torch's reentrant checkpoint called directly under DDP(find_unused_parameters=True); and
DDP's advice to turn that flag off (issue 41, parts 2 and 3).

The rank script hotfix_lab.cases.ddp_cases never mentions hotfix: launched without hotfix (HOTFIX_DISABLE=1) and with it
(the start-up hook), torchrun, gloo, CPU, 127.0.0.1, torch 2.13.0, transformers 4.56.2.  Each ``direct:`` case
trains with and without checkpointing under the same DDP and compares every trainable parameter's gradient (a
parameter without gradient equals only one without gradient):

* ``blocks``: a plain ``nn.Module`` whose blocks call ``torch.utils.checkpoint.checkpoint(block, x,
  use_reentrant=True)``, with a parameter never used (why the flag is set);
* ``remote``: a ``PreTrainedModel`` written as Hub modeling files are (tools/hotfix_lab/infra/remote_code_model.py):
  ``gradient_checkpointing_enable()``, then its forward calls the ``checkpoint`` its module imported at the top;
* ``moe``: a tiny Mixtral (8 experts, top-1, 3 tokens per rank: most experts get no token), checkpointed by
  transformers;
* ``unsloth:direct:blocks``, ``unsloth:direct:remote``: the same after unsloth's smart gradient checkpointing swapped
  unsloth-zoo's ``UnslothCheckpointFunction`` (2026.10.9, loaded on CPU) in for torch's class, as unsloth's own
  model code meets it (its layers call torch's checkpoint themselves);
* ``+join`` (uneven inputs: rank r has r+1 batches, under ``ddp.join()``), ``+no_sync`` (accumulation),
  ``+static_graph`` (DDP does not search: hotfix leaves it alone).

The launches without hotfix are recorded (tests/evidence/ddp-direct-checkpoint.json, support/evidence.py): each
rank's verdict and error per case, and the repair lines said (none).

DDP's advice ("did not find any unused parameters ... consider turning this flag off") is printed by torch once per
process, so each probe runs in a process of its own (one rank: DDP's search is local to a rank).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version as installed

import pytest

from conftest import DDP_WARM, launch_ranks, matrix_path, repair_notices, run_python
from hotfix_lab.infra.rank_results import LOOPBACK
from support import evidence

FIX = "torch-ddp-find-unused"
FIND_UNUSED = "Expected to mark a variable ready only once"
UNFINISHED = "Expected to have finished reduction in the prior iteration"
ADVICE = "find_unused_parameters=True was specified in DDP constructor, but did not find any unused parameters"
HOTFIX_ADVICE = "keep it on"
TWO_RANKS = ["direct:blocks", "direct:remote", "direct:moe", "direct:blocks+join", "direct:remote+join",
             "direct:blocks+no_sync", "direct:blocks+static_graph",
             "unsloth:direct:blocks", "unsloth:direct:remote"]  # last: unsloth's swap is process-wide
ZOO = "2026.10.9"
FOUR_RANKS = ["direct:blocks", "direct:remote", "direct:blocks+no_sync"]
TIMEOUT_S = 300
#: what an upstream launch is made of (support/evidence.py adds the lab's infrastructure and the comparison rule)
GUARDS = ("tools/hotfix_lab/cases/ddp_cases.py", "tests/e2e/test_ddp_direct_checkpoint.py")


def launch(folder, cases, ranks, *, disabled=False):
    """``ranks`` ranks of hotfix_lab.cases.ddp_cases (torchrun; one rank: a plain process); ({rank: result}, stderr)."""
    zoo = [matrix_path("unsloth-zoo", ZOO)] if any(case.startswith("unsloth:") for case in cases) else []
    results, proc = launch_ranks(folder, "hotfix_lab.cases.ddp_cases", cases, ranks, disabled=disabled, pythonpath=zoo,
                                 timeout=TIMEOUT_S, warm=DDP_WARM)
    return results, proc.stderr


def _facts(value):
    """What a re-measured upstream launch must show: per rank, hotfix off, the world, each case's verdict and error."""
    return {"notices": value["notices"],
            "ranks": {rank: {"hotfix_loaded": result["hotfix_loaded"], "world": result["world"],
                             "cases": {case: [found["ok"], found.get("equal"), (found.get("error") or "")[:80]]
                                       for case, found in result["cases"].items()}}
                      for rank, result in value["results"].items()}}


def upstream_launch(folder, cases, ranks):
    """``launch(..., disabled=True)``, recorded (tests/evidence/ddp-direct-checkpoint.json): (results, stderr's
    repair lines)."""
    def measure():
        results, stderr = launch(folder, cases, ranks, disabled=True)
        return {"results": results, "notices": repair_notices(stderr)}

    parts = {"ranks": ranks, "cases": cases, "torch": installed("torch"), "transformers": installed("transformers"),
             "unsloth_zoo": ZOO}
    value = evidence.upstream("ddp-direct-checkpoint", f"{ranks} ranks", parts, GUARDS, measure, _facts)
    return value["results"], "\n".join(value["notices"])


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    folder = tmp_path_factory.mktemp("direct")
    runs = {("upstream", 2): TWO_RANKS, ("hotfix", 2): TWO_RANKS, ("upstream", 4): FOUR_RANKS,
            ("hotfix", 4): FOUR_RANKS}
    with ThreadPoolExecutor(2) as pool:
        futures = {key: pool.submit(upstream_launch if key[0] == "upstream" else launch,
                                    folder / f"{key[0]}-{key[1]}", cases, key[1])
                   for key, cases in runs.items()}
        return {key: future.result() for key, future in futures.items()}


def test_upstream_fails_with_ddp_error_in_every_rank(launches):
    """Without hotfix: every direct call (a plain module, a remote-code model, uneven inputs under join, no_sync,
    2 and 4 ranks) and the MoE fail with DDP's "ready only once"; static_graph (no search) trains equal."""
    for ranks in (2, 4):
        results, stderr = launches[("upstream", ranks)]
        for rank, result in results.items():
            assert result["hotfix_loaded"] is False and result["world"] == ranks
            for case, found in result["cases"].items():
                if case.endswith("+static_graph"):
                    assert found["ok"] and found["equal"], (rank, case, found)
                else:
                    assert not found["ok"] and FIND_UNUSED in found["error"], (ranks, rank, case, found)
        assert repair_notices(stderr) == []


def test_with_hotfix_every_gradient_equals_ddp_without_checkpointing(launches):
    """With hotfix (the script unchanged): every case (unsloth's swapped class included) trains in every rank, every gradient equals DDP's without
    checkpointing, and the parameters without gradient (the unused ones, the experts no token reached) are exactly
    those without gradient there; the repair line names this fix for the direct calls."""
    for ranks in (2, 4):
        results, stderr = launches[("hotfix", ranks)]
        for rank, result in results.items():
            assert result["hotfix_loaded"] is True and result["world"] == ranks
            for case, found in result["cases"].items():
                assert found["ok"] and found["equal"] and found["missing"] == 0, (ranks, rank, case, found)
                assert found["without_gradient"] == found["reference_without_gradient"], (case, found)
            assert result["cases"]["direct:blocks"]["without_gradient"] == ["never_used.bias", "never_used.weight"]
            assert result["cases"]["direct:remote"]["without_gradient"] == ["unused.bias", "unused.weight"]
            if ranks == 2:  # unsloth's class took torch's place before its cases ran
                assert result["checkpoint_function"] == "UnslothCheckpointFunction", result
        assert any(FIX in line for line in repair_notices(stderr)), stderr[-3000:]
    moe = launches[("hotfix", 2)][0][0]["cases"]["direct:moe"]
    assert any(".experts." in name for name in moe["without_gradient"]), moe  # the case has unused experts


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("advice")
    cases = ["probe:moe", "probe:moe+checkpointing", "probe:lora", "probe:lora+checkpointing"]
    with ThreadPoolExecutor(2) as pool:
        futures = {case: pool.submit(launch, folder / case.replace(":", "-").replace("+", "-"), [case], 1)
                   for case in cases}
        followed = pool.submit(launch, folder / "followed", ["advice:lora", "advice:moe"], 1)
        found = {case: future.result() for case, future in futures.items()}
        found["followed"] = followed.result()
    return found


def test_ddp_advice_with_hotfix_is_answered_where_following_it_would_crash(probes):
    """MoE: without checkpointing DDP finds the unused experts (no advice); with reentrant checkpointing and hotfix
    DDP sees every parameter of a checkpointed layer and advises turning the flag off (torch prints it, from C++:
    hotfix cannot take it back), and one hotfix line says to keep it on, and why; following the advice crashes.
    LoRA with nothing unused: DDP's advice appears with and without checkpointing alike, no hotfix line, and
    following it trains."""
    def said(case):
        _, stderr = probes[case]
        return stderr.count(ADVICE), sum(HOTFIX_ADVICE in line for line in stderr.splitlines())

    assert said("probe:moe") == (0, 0)
    assert said("probe:moe+checkpointing") == (1, 1)
    assert said("probe:lora") == (1, 0)
    assert said("probe:lora+checkpointing") == (1, 0)
    for case in probes:
        if case != "followed":
            assert probes[case][0][0]["cases"][case]["ok"], probes[case][0]
    followed = probes["followed"][0][0]["cases"]
    assert followed["advice:lora"]["ok"], followed
    assert not followed["advice:moe"]["ok"] and UNFINISHED in followed["advice:moe"]["error"], followed
    line = next(line for line in probes["probe:moe+checkpointing"][1].splitlines() if HOTFIX_ADVICE in line)
    assert line.startswith("hotfix: transformers-ddp-find-unused: ") and ".experts." in line, line


PLAIN_TORCH = r"""
import json, os, socket, sys
import torch, torch.distributed as dist
from torch.utils.checkpoint import checkpoint
import hotfix  # a script that never imports transformers: the start-up hook waits for it, so the script names hotfix
loaded = hotfix.registry.active
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
torch.manual_seed(0)
stem, blocks, unused = torch.nn.Linear(4, 4), torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2)), torch.nn.Linear(4, 4)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.stem, self.blocks, self.unused = stem, blocks, unused
    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return x.square().mean()
ddp = torch.nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True)
try:
    ddp(torch.randn(2, 4)).backward()
    print(json.dumps({"loaded": loaded, "transformers": "transformers" in sys.modules, "ok": True}))
except RuntimeError as exc:
    print(json.dumps({"loaded": loaded, "transformers": "transformers" in sys.modules, "ok": False, "error": str(exc)[:200]}))
dist.destroy_process_group()
"""


def test_a_script_that_imports_only_torch_is_repaired():
    """A plain-torch script (no transformers) with ``import hotfix`` gets the repair, torch imported before hotfix;
    upstream (HOTFIX_DISABLE=1: the import is inert) fails with DDP's error."""
    results = {}
    for disabled in (True, False):
        proc = run_python(["-c", PLAIN_TORCH], env=dict(LOOPBACK, **({"HOTFIX_DISABLE": "1"} if disabled else {})),
                          timeout=TIMEOUT_S)
        results[disabled] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results[True] == {"loaded": False, "transformers": False, "ok": False,
                             "error": results[True].get("error")} and FIND_UNUSED in results[True]["error"]
    assert results[False] == {"loaded": True, "transformers": False, "ok": True}, results[False]
