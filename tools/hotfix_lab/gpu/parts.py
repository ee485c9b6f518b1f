"""The GPU kit's parts: one device call each, what it carries and how long it should take.

    python -P -m hotfix_lab.gpu.parts plan [--carry .whl]          the sequence of device calls (scripts/gpu/run --plan)
    python -P -m hotfix_lab.gpu.parts check-carry [--carry .whl]   each call's carry + working tree against 64 MiB
    python -P -m hotfix_lab.gpu.parts carry PART [--carry .whl]     the carry list of one part, one path a line

A device call may run 10 minutes and carry 64 MiB with the working tree; a session gets 15
device-minutes (30 until 2026-11-29), so not every part fits in one session: the plan says which.
The kit once ran whole in one call (517 s of 600, three benchmark variants
skipped by its time budget, 2026-11-25): now each part is its own call, well under 8 minutes
with its installs, and carries only the folders it needs (scripts/gpu/build-carry fills them):

  base/     hotfix's wheel, transformers 4.56.2 + tokenizers 0.22.1 + huggingface-hub 0.36.0,
            every unsloth-zoo release of tests/matrix.txt
  t5/       transformers 5.23.0 (activation_checkpointing_enable; the image has 5.17.0)
  ds/       DeepSpeed 0.19.8 (built without C++ ops) and the pure-Python packages it needs (extras' ZeRO-3 case)
  ds192/    DeepSpeed 0.19.2's wheel alone (built the same way; the packages it needs come from ds/): extras' ZeRO-3
            cases before DeepSpeed's own fix of non-reentrant checkpointing with frozen parameters
  unsloth/  unsloth and the pure-Python packages the image lacks (tools/hotfix_lab/gpu/unsloth-carry.txt)

Estimates are for an H100 and come from the 2026-11-25 logs (../shared/gpu-runs/2026-11-25/ and
docs/gpu-runs/2026-11-25-unsloth-flow/): installs about 20 s per call; a whisper_steps child at
test dims 14-25 s alone; a benchmark variant at large-v3 32-69 s over six batch sizes; a soak of
80 steps 41-64 s; a FastModel flow variant 46 s eager, 100 s with unsloth's compiled modules.
None of these parts has run on a GPU in this form: every estimate is an estimate, not a
measurement of the part; the first run of each part records its own time (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Optional, Tuple

from hotfix_lab.infra import paths

REPO = str(paths.REPO)


@dataclass(frozen=True)
class Part:
    name: str
    carry: Tuple[str, ...]  # sub-folders of the carry folder
    estimate_s: int
    what: str
    basis: str
    #: (seconds, "date, device") of this part's own run on a GPU, once one is recorded in docs/gpu.md; until
    #: then the plan labels the time an estimate
    measured: Optional[Tuple[int, str]] = None

    @property
    def seconds(self):
        return self.measured[0] if self.measured else self.estimate_s

    @property
    def time_label(self):
        if self.measured:
            return f"~{self.measured[0] / 60:.1f} min (measured {self.measured[1]})"
        return f"~{self.estimate_s / 60:.1f} min (estimated; this part has not run on a GPU)"


PARTS = (
    Part("tests", ("base", "t5"), 210,
         "GPU tests, deterministic (unsloth-zoo releases upstream vs hotfix at batch 4, bf16, FSDP vs FSDP without "
         "checkpointing, transformers 5.23 activation_checkpointing_enable(offload=True)) and CUDA's stream "
         "sanitizer at batch 4 (offload line asserted), children several at a time",
         "10 whisper_steps children (14-25 s each alone) 8 at a time, 3 accelerate launches (a pair took "
         "48-52 s) at once, 2 new-API children, the 2 sanitizer children (23-25 s) beside them, installs 20 s",
         measured=(109, "2026-11-29, H200")),
    Part("bench", ("base", "t5"), 330,
         "benchmark, large-v3 dims, bf16, LoRA r=64, batches 1,8,64: 9 variants one after the other, "
         "including the step-1 anchor (upstream 2025.11.5 on a shape it trains) and transformers 5.23's offload",
         "9 variants x ~35 s (32-69 s each over six batch sizes in the kit; three now), stops at 430 s"),
    Part("extras", ("base", "t5", "ds", "ds192"), 280,
         "soak (80 AdamW steps: hotfix + 2025.11.3, use_reentrant=False, upstream 2025.11.3, at once); then at once: "
         "torch.compile (inductor) over checkpointed models (tools/hotfix_lab/cases/compile_case.py), 1-GPU DDP with "
         "find_unused_parameters=True, upstream and hotfix (tools/hotfix_lab/cases/ddp_cases.py under torchrun, 10 cases), "
         "torch's checkpoint_wrapper under FSDP1/FSDP2 (tools/hotfix_lab/cases/wrapper_cases.py, 4 cases), and "
         "unsloth's offload under transformers 5.23's non-reentrant default and TRL's kwargs on unsloth-zoo "
         "2025.11.5 and 2026.10.9 (tools/hotfix_lab/gpu/nonreentrant.py, 10 children 5 at a time), and DeepSpeed ZeRO-3 on "
         "one GPU, upstream and hotfix (tools/hotfix_lab/cases/deepspeed_cases.py under torchrun: DeepSpeed 0.19.8, 5 cases; "
         "DeepSpeed 0.19.2, before its own fix, 3 cases: LoRA non-reentrant, where upstream fails and "
         "deepspeed-zero3-frozen-recompute repairs, and reentrant), and unsloth's offload with every pinned host "
         "allocation refused (tools/hotfix_lab/gpu/whisper_steps.py --refuse-pinned, 2025.11.3, upstream and hotfix, 2 steps)",
         "soak runs 41-64 s each alone (soak.txt), 3 at once ~100 s; compile 5-30 s per first step plus start-up "
         "(compile.txt); DDP and non-reentrant children are tiny models or single steps, mostly import time (CPU: "
         "DDP 16 s per run, a non-reentrant child ~30 s on 2 loaded cores); the DeepSpeed launches (4, beside the "
         "rest) tiny models, mostly import time; the two pinned-refused runs (test dims, 2 steps) beside them; "
         "installs 25 s",
         measured=(206, "2026-11-29, H200")),
    Part("fit", ("base", "t5"), 330,
         "largest batch per variant (non-reentrant, hotfix + 2025.11.3, transformers 5.23 offload, none), "
         "one step per probe, 60 s per probe, 100 s per variant",
         "probe8.sh: non-reentrant b352 fit, b384 out of memory; hotfix b640 gave nothing in 115 s; the search "
         "stops at 330 s into the call"),
    Part("unsloth", ("base", "unsloth"), 270,
         "the seed's own flow: unsloth FastModel, Whisper, LoRA r=64, use_gradient_checkpointing=\"unsloth\", "
         "batch 4, hotfix and upstream, unsloth's compiled modules and eager (tests/versions/test_unsloth_gpu.py, "
         "tools/hotfix_lab/gpu/unsloth_flow.py --jobs 2)",
         "2026-11-25 H100 calls: a variant 100 s compiled (call4), 46 s eager (call5) alone; two at a time ~130 s "
         "then ~60 s; checkpoint 20 s, installs 20 s, pytest 10 s; pytest stops at 575 s into the call"),
)
BY_NAME = {part.name: part for part in PARTS}
#: device seconds a session is lent (the device tool's status: budget_left_s at a session's start)
SESSION_S = 900
#: seconds a machine's start took (2026-11-29, H200: the lease's held_s less the calls' wall_s)
START_S = 30


def carry_list(part, carry=".whl"):
    return [f"{carry.rstrip('/')}/{sub}" for sub in BY_NAME[part].carry]


def plan(carry=".whl"):
    lines = ["GPU kit: one device call per part, in this order (run() of the device tool; $OUT comes back).",
             "Issue each call as soon as the previous one returns: an idle machine is handed back within a",
             "minute, and a fresh one costs its start-up again (each part installs what it needs itself).", ""]
    total = 0
    for number, part in enumerate(PARTS, 1):
        total += part.seconds
        lines.append(f"{number}. run(command=\"bash scripts/gpu/run --part {part.name}\", "
                     f"carry={carry_list(part.name, carry)!r}, timeout_s=600)")
        lines.append(f"   {part.time_label}: {part.what}")
        lines.append(f"   estimate: {part.basis}")
    measured = sum(1 for part in PARTS if part.measured)
    lines += ["", f"total ~{total / 60:.0f} device-minutes ({measured} of {len(PARTS)} parts measured, the rest "
                  f"estimated) plus each machine start (~{START_S} s on 2026-11-29); a session has {SESSION_S // 60}:"
                  + (" all fit." if total + START_S * len(PARTS) <= SESSION_S else
                     " not all fit; run first what docs/gpu.md says has not run on a GPU (two parts can share a "
                     "call: HOTFIX_GPU_END_S, OUT per part)."),
              "After each call: copy the files under files_at into docs/gpu-runs/<date>-<part>-<commit>/ "
              "and record them in docs/gpu.md."]
    return "\n".join(lines)


def check_carry(carry=".whl", root=REPO):
    """(part, tree bytes, carried bytes, fits) for every part whose folders are all built."""
    from hotfix_lab.gpu import carry_size

    found = []
    for part in PARTS:
        folders = [os.path.join(root, path) if not os.path.isabs(path) else path for path in carry_list(part.name, carry)]
        if not all(os.path.isdir(folder) for folder in folders):
            continue
        found.append((part.name, *carry_size.check(root, folders)))
    return found


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=("plan", "check-carry", "carry"))
    p.add_argument("part", nargs="?")
    p.add_argument("--carry", default=".whl")
    p.add_argument("--root", default=REPO)
    args = p.parse_args(argv)
    if args.command == "plan":
        print(plan(args.carry))
        return 0
    if args.command == "carry":
        if args.part not in BY_NAME:
            p.error(f"part must be one of {', '.join(BY_NAME)}")
        print("\n".join(carry_list(args.part, args.carry)))
        return 0
    status = 0
    for name, tree, carried, fits in check_carry(args.carry, args.root):
        print(f"part {name}: carry {carried / 2**20:.2f} MiB + working tree {tree / 2**20:.2f} MiB = "
              f"{(tree + carried) / 2**20:.2f} MiB (limit 64 MiB): {'fits' if fits else 'OVER THE LIMIT'}")
        status |= 0 if fits else 1
    return status


if __name__ == "__main__":
    sys.exit(main())
