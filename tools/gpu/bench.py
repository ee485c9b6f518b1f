"""GPU benchmark of the kit: Whisper (large-v3 dimensions by default, LoRA r=64 on q/v, bf16).

Every variant runs in its own interpreter (tools/gpu/whisper_steps.py), one
after the other, within a time budget; results go to one JSON file that
tools/gpu/report.py turns into ratios.  Variants (issue 10):

  none                 no checkpointing                                     hotfix off
  non-reentrant        use_reentrant=False (the forum workaround)           hotfix off
  zoo-2025.11.3        unsloth-zoo 2025.11.3 upstream (seed: expected crash) hotfix off
  hotfix+zoo-2025.11.3 the same release with hotfix
  zoo-2025.11.5        2025.11.5's own offload (hotfix's transformers fixes on, its zoo fixes off)
  hotfix+zoo-2026.10.9 latest release with hotfix
  hf-offload           transformers' own activation_checkpointing_enable(offload=True),
                       on the machine's transformers (>= 5.17), hotfix off
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = os.path.join(HERE, "whisper_steps.py")
ZOO_FIXES = "unsloth-zoo-closure-tensors,unsloth-zoo-offload-backward"

# name -> (mode, zoo release or None, environment, use the carried transformers 4.56.2)
VARIANTS = [
    ("none", "none", None, {"HOTFIX_DISABLE": "1"}, True),
    ("non-reentrant", "non-reentrant", None, {"HOTFIX_DISABLE": "1"}, True),
    ("zoo-2025.11.3", "unsloth", "2025.11.3", {"HOTFIX_DISABLE": "1"}, True),
    ("hotfix+zoo-2025.11.3", "unsloth", "2025.11.3", {}, True),
    ("zoo-2025.11.5", "unsloth", "2025.11.5", {"HOTFIX_DISABLED_PATCHES": ZOO_FIXES}, True),
    ("hotfix+zoo-2026.10.9", "unsloth", "2026.10.9", {}, True),
    ("hf-offload", "hf-offload", None, {"HOTFIX_DISABLE": "1"}, False),
]


def variant_command(mode, zoo, args, time_budget):
    cmd = [sys.executable, STEPS, "--mode", mode, "--dims", args.dims, "--dtype", args.dtype, "--device", args.device,
           "--batches", args.batches, "--steps", str(args.steps), "--lora", str(args.lora),
           "--compare-batches", args.batches.split(",")[0],  # correctness at the first batch size
           "--time-budget", str(time_budget)]
    if zoo:
        cmd += ["--zoo", args.zoo[zoo]]
    return cmd


def plan_variant(name, mode, zoo, carried_transformers, args):
    """What a variant would run, and whether what it needs is there (``--dry-run``: the GPU-only part stubbed)."""
    row = {"variant": name, "status": "planned",
           "command": variant_command(mode, zoo, args, args.per_variant)}
    needed = [STEPS]
    if zoo:
        needed.append(os.path.join(args.zoo[zoo], "unsloth_zoo", "gradient_checkpointing.py"))
    if carried_transformers and args.transformers:
        needed.append(os.path.join(args.transformers, "transformers", "__init__.py"))
    missing = [path for path in needed if not os.path.isfile(path)]
    if missing:
        row.update(status="missing", error="not found: " + ", ".join(missing))
    return row


def run_variant(name, mode, zoo, extra_env, carried_transformers, args, deadline):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTFIX_")}
    env.update(extra_env)
    paths = [args.transformers] if carried_transformers and args.transformers else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = variant_command(mode, zoo, args, max(30.0, min(args.per_variant, deadline - time.monotonic())))
    left = deadline - time.monotonic()
    if left < 30:
        return [{"variant": name, "status": "skipped", "error": "benchmark time budget used up"}]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        return [{"variant": name, "status": "skipped", "error": "timed out"}]
    rows = [dict(json.loads(l), variant=name) for l in proc.stdout.splitlines() if l.startswith("{")]
    if not rows:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        rows = [{"variant": name, "status": "crash", "error": f"child failed (rc {proc.returncode}): {tail}"}]
    return rows


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--zoo", action="append", default=[], help="VERSION=DIR of an unpacked unsloth-zoo release")
    p.add_argument("--transformers", default=None, help="directory holding the carried transformers 4.56.2")
    p.add_argument("--dims", default="large-v3")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1,4,auto")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lora", type=int, default=64)
    p.add_argument("--budget", type=float, default=420.0, help="seconds for all variants together")
    p.add_argument("--per-variant", type=float, default=150.0)
    p.add_argument("--only", default=None, help="comma list of variant names")
    p.add_argument("--dry-run", action="store_true",
                   help="run nothing: check each variant's inputs exist and record the command it would run")
    args = p.parse_args(argv)
    args.zoo = dict(item.split("=", 1) for item in args.zoo)
    deadline = time.monotonic() + args.budget
    rows = []
    for name, mode, zoo, env, carried in VARIANTS:
        if args.only and name not in args.only.split(","):
            continue
        if zoo and zoo not in args.zoo:
            # A dry run fails on it: the real run would silently skip the variant.
            rows.append({"variant": name, "status": "missing" if args.dry_run else "skipped",
                         "error": f"unsloth-zoo {zoo} not carried"})
            continue
        if args.dry_run:
            rows.append(plan_variant(name, mode, zoo, carried, args))
            print(f"bench (dry run): {name}: {rows[-1]['status']}" + (f" ({rows[-1]['error']})" if "error" in rows[-1]
                                                                       else ""), flush=True)
            continue
        started = time.monotonic()
        found = run_variant(name, mode, zoo, env, carried, args, deadline)
        for row in found:
            row["variant_seconds"] = round(time.monotonic() - started, 1)
        rows += found
        print(f"bench: {name}: " + ", ".join(f"b{r.get('batch')} {r['status']}" for r in found), flush=True)
    with open(args.out, "w") as handle:
        json.dump({"settings": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows}, handle, indent=1)
    return 1 if any(row["status"] == "missing" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
