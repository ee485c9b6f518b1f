"""A torch-only DDP script (no transformers, no `import hotfix`): blocks calling torch's reentrant checkpoint under
DDP(find_unused_parameters=True), a parameter never used (why the flag is set).  Launched by
tests/e2e/test_torch_only_ddp.py with torchrun: RESULT_DIR first (tools/lab/rank_results.py's protocol).

Each rank trains one step with checkpointing and one without (the same weights, its share of the batch), under DDP
built the same way, and records every gradient's comparison (hotfix's rule, loaded without importing hotfix), and
whether hotfix and transformers were loaded, before and after the DDP was built."""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.utils.checkpoint

import rank_results  # tools/lab
import standalone  # tools/lab

compare = standalone.load("compare")
BEFORE = "hotfix" in sys.modules


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Model(torch.nn.Module):
    def __init__(self, checkpointing):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.unused = torch.nn.Linear(8, 8)
        self.checkpointing = checkpointing

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True) if self.checkpointing else block(x)
        return x.square().mean()


def grads(checkpointing, rank, world):
    ddp = torch.nn.parallel.DistributedDataParallel(Model(checkpointing), find_unused_parameters=True)
    x = torch.randn(4 * world, 8, generator=torch.Generator().manual_seed(1)).chunk(world)[rank]
    ddp(x.requires_grad_(True)).backward()
    return compare.collect_grads(ddp.module)


def main():
    result_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank, "world": world, "hotfix_before_ddp": BEFORE, "cases": {}}
    try:
        reference = grads(False, rank, world)
        found = compare.compare_grads(reference, grads(True, rank, world))
        out["cases"]["blocks"] = {"ok": True, "equal": found.ok, "missing": len(found.missing),
                                  "summary": found.summary()}
    except Exception as exc:
        out["cases"]["blocks"] = {"ok": False, "error": compare.short_error(exc)}
    out["hotfix_after"] = "hotfix" in sys.modules
    out["transformers_loaded"] = "transformers" in sys.modules
    rank_results.write_rank_file(result_dir, out)
    rank_results.leave()


if __name__ == "__main__":
    main()
