#!/usr/bin/env python3
"""What deepspeed-zero3-frozen-recompute keeps alive, against DeepSpeed 0.19.8's own fix (issue 42, part 3).

    .venv-test/bin/python -P -m hotfix_lab.bench.deepspeed_memory [--layers 4] [--width 256] [--out FILE.json]

DeepSpeed ZeRO-3, 2 gloo ranks on 127.0.0.1 (DeepSpeed's CPU accelerator), a Llama-style model
(hotfix_lab.cases.ddp_cases's, at ``--width`` / ``--layers``) with PEFT LoRA (r 4) on q_proj/v_proj: every other
parameter frozen, every parameter partitioned (``stage3_param_persistence_threshold`` 0, as a model's large
weights are) and released after use (``stage3_max_reuse_distance`` and ``stage3_prefetch_bucket_size`` 0: ZeRO-3
would otherwise keep these small weights gathered, as it does a large model's within its reuse distance).  Two training steps; in each backward, after every module event of ZeRO-3's coordinator (a
submodule's parameters fetched or released: the points between which the backward's operations run), the bytes of
gathered storage that frozen parameters hold, each storage counted once while anything keeps it (the parameter,
or the alias hotfix saves in its place): torch's ``StorageWeakRef``.  Printed per variant, per step: the peak and
the mean over those events, each as a ratio to DeepSpeed 0.19.8's fix from the same run, and the part of those
bytes no parameter holds any more (ZeRO-3 partitioned it; something else keeps its gathered storage: what the
repair's aliases alone keep alive):

* ``0.19.2 hotfix``: non-reentrant checkpointing, DeepSpeed 0.19.2 (before its fix), hotfix's repair;
* ``0.19.8 upstream``: non-reentrant checkpointing, DeepSpeed 0.19.8 (its fix: frozen parameters gathered by the
  recomputation stay gathered until the backward of the module that started it; hotfix's fix is not applied there);
* ``0.19.2 hotfix reentrant``: the workaround, reentrant checkpointing (no recomputation inside torch's hooks);
* ``0.19.8 reentrant``: the same mode on 0.19.8 (neither fix acts on reentrant checkpointing), so
  ``0.19.2 hotfix reentrant`` / ``0.19.8 reentrant`` is the releases' own ratio under one mode, beside the repair's;
* ``0.19.2 none``, ``0.19.8 none``: no checkpointing, each release (what each release's ZeRO-3 holds in a backward
  anyway: the two differ widely, so a ratio across releases is not hotfix's alone).

Step 1 runs while ZeRO-3 records its trace (it releases every parameter after each module); step 2 with the trace
complete (its prefetching and reuse rules on).  Needs .matrix/deepspeed-0.19.2 and -0.19.8 (scripts/test.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from hotfix_lab.infra.paths import REPO, TOOLS

MATRIX = REPO / ".matrix"
#: name -> (DeepSpeed release, checkpointing mode)
VARIANTS = {
    "0.19.2 hotfix": ("0.19.2", "nonreentrant"),
    "0.19.8 upstream": ("0.19.8", "nonreentrant"),
    "0.19.2 hotfix reentrant": ("0.19.2", "reentrant"),
    "0.19.8 reentrant": ("0.19.8", "reentrant"),
    "0.19.2 none": ("0.19.2", "none"),
    "0.19.8 none": ("0.19.8", "none"),
}
REFERENCE = "0.19.8 upstream"
STEPS = 2


# ---------------------------------------------------------------------------------------------- one rank (torchrun)
def worker(mode: str, layers: int, width: int, out: str) -> None:
    import torch
    import transformers  # noqa: F401  the start-up hook activates hotfix here, as in a user's script

    hotfix_loaded = "hotfix" in sys.modules
    import deepspeed
    import torch.distributed as dist
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
    from torch.multiprocessing.reductions import StorageWeakRef

    from hotfix_lab.cases import ddp_cases
    from hotfix_lab.cases import deepspeed_cases

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = ddp_cases.with_lora(ddp_cases.tiny_llama(hidden_size=width, intermediate_size=2 * width,
                                                     num_hidden_layers=layers, num_attention_heads=4,
                                                     num_key_value_heads=4))
    model.enable_input_require_grads()
    if mode != "none":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": mode == "reentrant"})
    frozen = [p for p in model.parameters() if not p.requires_grad]
    frozen_bytes = sum(p.numel() * p.element_size() for p in frozen)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    config = deepspeed_cases.config(3, world)  # the census's and the e2e test's, with ZeRO-3 releasing every parameter
    config["zero_optimization"].update(stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0,
                                       stage3_prefetch_bucket_size=0)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    held: dict = {}  # storage key -> (StorageWeakRef, bytes): every gathered storage a frozen parameter has had
    samples: list = []  # bytes held at each module event of the backward under way

    def note_gathered() -> set:
        """Note every frozen parameter's gathered storage; return the keys of those gathered now."""
        now = set()
        for p in frozen:
            if p.numel() and p.numel() == p.ds_numel:  # gathered now
                storage = p.data.untyped_storage()
                ref = StorageWeakRef(storage)
                held.setdefault(ref.cdata, (ref, storage.nbytes()))
                now.add(ref.cdata)
        return now

    def sample() -> None:
        gathered_now = note_gathered()
        for key in [key for key, (ref, _) in held.items() if ref.expired()]:
            del held[key]
        if torch._C._current_graph_task_id() != -1:  # inside a backward
            # (all held, the part no parameter holds any more: ZeRO-3 partitioned the parameter, something else
            # keeps its gathered storage alive: hotfix's aliases on 0.19.2, nothing else in these runs)
            samples.append((sum(nbytes for _, nbytes in held.values()),
                            sum(nbytes for key, (_, nbytes) in held.items() if key not in gathered_now)))

    def sampled(method):
        def call(self, *args, **kwargs):
            result = method(self, *args, **kwargs)
            sample()
            return result
        return call

    for name in ("fetch_sub_module", "release_sub_module"):
        setattr(PartitionedParameterCoordinator, name, sampled(getattr(PartitionedParameterCoordinator, name)))

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (ddp_cases.BATCH, ddp_cases.LENGTH), generator=g).chunk(world)[rank]
    steps = []
    for _ in range(STEPS):
        samples.clear()
        engine.backward(engine(input_ids=ids, labels=ids.clone()).loss)
        engine.step()
        totals, unowned = [total for total, _ in samples], [kept for _, kept in samples]
        steps.append({"peak": max(totals, default=0), "mean": sum(totals) / max(len(totals), 1),
                      "unowned_peak": max(unowned, default=0), "unowned_mean": sum(unowned) / max(len(unowned), 1),
                      "events": len(samples)})
    result = {"rank": rank, "hotfix_loaded": hotfix_loaded, "deepspeed": deepspeed.__version__,
              "torch": torch.__version__, "transformers": transformers.__version__, "frozen_bytes": frozen_bytes,
              "layer_frozen_bytes": frozen_bytes // layers, "steps": steps}
    applied = []
    if hotfix_loaded:
        import hotfix

        applied = [name for name, fix in hotfix.known_patches().items() if fix.applied and "deepspeed" in name]
    result["deepspeed_fixes_applied"] = applied
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    engine.destroy()
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------- driver
def run_variant(name: str, layers: int, width: int) -> dict:
    release, mode = VARIANTS[name]
    folder = tempfile.mkdtemp(prefix="ds-memory-")
    import torch

    from hotfix_lab.infra import deepspeed_env
    from hotfix_lab.infra import rank_results

    folder_of_release = MATRIX / f"deepspeed-{release}"
    command, loopback = rank_results.command(["-m", __spec__.name, "--worker", mode, "--layers", str(layers), "--width",
                                              str(width), "--out", folder])
    env = dict(os.environ, **{**loopback, **deepspeed_env.cpu_env(folder_of_release, torch.__version__)},
               PYTHONPATH=os.pathsep.join([str(folder_of_release), str(TOOLS)]))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    ranks = [result for _, result in sorted(rank_results.read(Path(folder)).items())]
    if len(ranks) != 2:
        raise SystemExit(f"{name}: rc {proc.returncode}\n{proc.stderr[-4000:]}")
    return {"variant": name, "mode": mode, "ranks": ranks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--out", help="write the figures here as JSON too")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.layers, args.width, args.out)
    results = {name: run_variant(name, args.layers, args.width) for name in VARIANTS}
    first = results[REFERENCE]["ranks"][0]
    mib = 2 ** 20
    print(f"{platform.node()} {platform.processor() or platform.machine()}, torch {first['torch']}, transformers "
          f"{first['transformers']}, {args.layers} layers x {args.width}, LoRA r 4 on q_proj/v_proj, ZeRO-3, 2 ranks")
    print(f"frozen parameters: {first['frozen_bytes'] / mib:.2f} MiB in all, {first['layer_frozen_bytes'] / mib:.2f} "
          "MiB per layer (each rank gathers them whole)")
    print("variant | DeepSpeed | fixes applied | step | peak MiB (ratio) | mean MiB (ratio) | events | of which no "
          "parameter holds: peak, mean MiB   [rank 0; rank 1]")
    for name, found in results.items():
        for step in range(STEPS):
            cells = []
            for rank in found["ranks"]:
                ref = results[REFERENCE]["ranks"][rank["rank"]]["steps"][step]
                mine = rank["steps"][step]
                cells.append(f"{mine['peak'] / mib:.2f} ({mine['peak'] / ref['peak']:.3f}) | "
                             f"{mine['mean'] / mib:.2f} ({mine['mean'] / ref['mean']:.3f}) | {mine['events']} | "
                             f"{mine['unowned_peak'] / mib:.2f}, {mine['unowned_mean'] / mib:.2f}")
            zero = found["ranks"][0]
            print(f"{name} | {zero['deepspeed']} | {','.join(zero['deepspeed_fixes_applied']) or '-'} | {step + 1} | "
                  + "   ;   ".join(cells))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
