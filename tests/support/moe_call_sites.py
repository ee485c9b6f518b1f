"""Child: the drifted plain-torch MoE (moe_block) checkpointed through one call site; one JSON line.

    python moe_call_sites.py SITE PORT     SITE: unsloth | deepspeed | wrapper-reentrant | wrapper-no-reentrant |
                                           ddp | fsdp2

unsloth: unsloth-zoo's ``UnslothCheckpointFunction.apply`` (the release on PYTHONPATH, loaded on CPU by
hotfix_lab.infra.zoo_loader); deepspeed: ``deepspeed.checkpointing.checkpoint`` (one gloo rank, its CPU accelerator);
wrapper-*: torch's ``checkpoint_wrapper`` around each block (the fix reads a block's classes when it is wrapped);
ddp / fsdp2: the model under DistributedDataParallel / fully_shard on one gloo rank, torch's non-reentrant checkpoint.
HOTFIX_DISABLE=1: upstream.  With hotfix, the other sites: the fix reads the model's classes (``route``: what
transformers' enabler does for a transformers model).
"""

from __future__ import annotations

import json
import os
import sys

import torch

site = sys.argv[1]
if site == "unsloth":
    from hotfix_lab.infra import zoo_loader

    release = zoo_loader.load_release()
    zoo_loader.cpu_initialize(release)
import hotfix  # noqa: E402  (after the release: the fix meets it already imported, as after `import unsloth`)

if site == "unsloth":
    def function(block, x):
        return release.UnslothCheckpointFunction.apply(block, True, x)
elif site == "deepspeed":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    from deepspeed.runtime.activation_checkpointing import checkpointing

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    deepspeed.init_distributed(dist_backend="gloo")
    checkpointing.configure(None, partition_activations=False, checkpoint_in_cpu=False,
                            contiguous_checkpointing=False, num_checkpoints=None, synchronize=False, profile=False)

    def function(block, x):
        return checkpointing.checkpoint(block, x)
elif site in ("ddp", "fsdp2"):
    import functools

    import torch.distributed as dist
    from torch.utils.checkpoint import checkpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    function = functools.partial(checkpoint, use_reentrant=False)
else:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    impl = CheckpointImpl.REENTRANT if site == "wrapper-reentrant" else CheckpointImpl.NO_REENTRANT
    function = None

import moe_block  # noqa: E402
from hotfix_lab.cases import moe_cases  # noqa: E402
from hotfix.diagnostics.compare import collect_grads, compare_grads  # noqa: E402

model = moe_block.Model()
moe_cases.tie_and_drift(model, moe_block.EXPERTS, moe_block.TOP_K)
x = torch.randn(3, 5, moe_block.WIDTH, generator=torch.Generator().manual_seed(1)).requires_grad_()


def step(checkpoint=None):
    model.zero_grad(set_to_none=True)
    model(x, checkpoint=checkpoint).backward()
    return collect_grads(getattr(model, "module", model))


if site == "ddp":  # one gloo rank: DDP's hooks and reducer in the call, as on every rank
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(model, find_unused_parameters=True)  # experts a step never hits
elif site == "fsdp2":  # each block and the model sharded over one rank (fully_shard: torch >= 2.6)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
reference = step()
if function is None:  # the wrapper: each block wrapped in place, called plainly
    for index, block in enumerate(model.blocks):
        model.blocks[index] = checkpoint_wrapper(block, checkpoint_impl=impl)
out = {"site": site, "hotfix": os.environ.get("HOTFIX_DISABLE") != "1"}
if out["hotfix"] and function is not None:  # under checkpoint_wrapper the fix read the blocks when they were wrapped
    hotfix.known_patches()["moe-routing-replay"].route(getattr(model, "module", model))
try:
    grads = step(function)
    if function is None:  # the wrapper's parameter names carry its prefix
        grads = {name.replace("_checkpoint_wrapped_module.", ""): grad for name, grad in grads.items()}
    if site == "fsdp2":  # sharded gradients (DTensors over one rank): their full values
        grads = {name: None if grad is None else grad.full_tensor() for name, grad in grads.items()}
        reference = {name: None if grad is None else grad.full_tensor() for name, grad in reference.items()}
    report = compare_grads(reference, grads, rtol=1e-4)
    out.update(status="equal" if report.ok else "differs", summary=report.summary())
except Exception as exc:
    out.update(status="crash", error=f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
print(json.dumps(out), flush=True)
