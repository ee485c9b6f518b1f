"""GPU benchmark of the kit: Whisper (large-v3 dimensions by default, LoRA r=64 on q/v, bf16).

Every variant runs in its own interpreter (tools/hotfix_lab/gpu/whisper_steps.py), one
after the other, within a time budget (most telling first, so a short budget
drops the least); results go to one JSON file that tools/hotfix_lab/gpu/report.py turns
into ratios.  Variants:

  non-reentrant              use_reentrant=False (the forum workaround)             hotfix off
  hotfix+zoo-2025.11.3       unsloth-zoo 2025.11.3's offload with hotfix
  anchor:zoo-2025.11.5       upstream 2025.11.5 (first release offloading in step 1), hotfix off,
                             on the anchor shape (below)
  anchor:hotfix+zoo-2025.11.3  hotfix + 2025.11.3 on the anchor shape: the step-1 peak ratio
  hf-offload                 transformers 5.23's own activation_checkpointing_enable(offload=True),
                             the carried 5.23.0, hotfix off
  hotfix+zoo-2026.10.9       latest release with hotfix
  zoo-2025.11.5              2025.11.5's own offload with hotfix's transformers fixes on, its zoo
                             fixes opted out (HOTFIX_DISABLED_PATCHES)
  zoo-2025.11.3              2025.11.3 upstream, hotfix off (LoRA: the encoder adapters get no gradient)
  none                       no checkpointing                                        hotfix off

The anchor shape is one upstream can train correctly: adapters on the decoder only (the encoder
frozen, so no checkpointed layer has a frozen input with trainable parameters and no tensor the
checkpoint cannot see needs a gradient) and 448 label tokens (decoder layer inputs above unsloth's
2 MiB offload threshold from batch 2 on).  The gradients column (at the first batch size) is
whisper_steps' --compare with --noise-floor and --against non-reentrant: the bound of
tools/hotfix_lab/gpu/equality.py from what this run measured; a missing gradient is never equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

STEPS = "hotfix_lab.gpu.whisper_steps"  # each variant's child runs it (python -m)
ZOO_FIXES = "unsloth-zoo-closure-tensors,unsloth-zoo-offload-backward"
OFF = {"HOTFIX_DISABLE": "1"}
ANCHOR = ("--lora-scope", "decoder", "--labels", "448")

# name -> (mode, zoo release or None, environment, transformers: "4" carried 4.56.2 | "5" carried 5.23.0, extra args)
VARIANTS = [
    ("non-reentrant", "non-reentrant", None, OFF, "4", ()),
    ("hotfix+zoo-2025.11.3", "unsloth", "2025.11.3", {}, "4", ()),
    ("anchor:zoo-2025.11.5", "unsloth", "2025.11.5", OFF, "4", ANCHOR),
    ("anchor:hotfix+zoo-2025.11.3", "unsloth", "2025.11.3", {}, "4", ANCHOR),
    ("hf-offload", "hf-offload", None, OFF, "5", ()),
    ("hotfix+zoo-2026.10.9", "unsloth", "2026.10.9", {}, "4", ()),
    ("zoo-2025.11.5", "unsloth", "2025.11.5", {"HOTFIX_DISABLED_PATCHES": ZOO_FIXES}, "4", ()),
    ("zoo-2025.11.3", "unsloth", "2025.11.3", OFF, "4", ()),
    ("none", "none", None, OFF, "4", ()),
]


def variant_command(mode, zoo, extra, args, time_budget, batches=None, compare=True):
    batches = batches or args.batches
    cmd = [sys.executable, "-m", STEPS, "--mode", mode, "--dims", args.dims, "--dtype", args.dtype, "--device", args.device,
           "--batches", batches, "--steps", str(args.steps), "--lora", str(args.lora),
           "--time-budget", str(time_budget), *extra]
    if compare:  # correctness at the first batch size, bound from this run's noise and the workaround
        cmd += ["--compare-batches", batches.split(",")[0], "--noise-floor", "--against", "non-reentrant"]
    if zoo:
        cmd += ["--zoo", args.zoo[zoo]]
    return cmd


def transformers_dir(which, args):
    return args.transformers5 if which == "5" else args.transformers


def variant_env(extra_env, which, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTFIX_")}
    env.update(extra_env)
    folder = transformers_dir(which, args)
    paths = [folder] if folder else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def selected(args):
    """The variants to run: (name, mode, zoo, env, transformers, extra), with a row for each that cannot run."""
    rows, chosen = [], []
    for name, mode, zoo, env, which, extra in VARIANTS:
        if args.only and name not in args.only.split(","):
            continue
        if zoo and zoo not in args.zoo:
            # A dry run fails on it: the real run would silently skip the variant.
            rows.append({"variant": name, "status": "missing" if args.dry_run else "skipped",
                         "error": f"unsloth-zoo {zoo} not carried"})
            continue
        chosen.append((name, mode, zoo, env, which, extra))
    return rows, chosen


def plan_variant(name, mode, zoo, which, extra, args):
    """What a variant would run, and whether what it needs is there (``--dry-run``: the GPU-only part stubbed)."""
    row = {"variant": name, "status": "planned", "command": variant_command(mode, zoo, extra, args, args.per_variant)}
    needed = []
    if zoo:
        needed.append(os.path.join(args.zoo[zoo], "unsloth_zoo", "gradient_checkpointing.py"))
    folder = transformers_dir(which, args)
    if folder:
        needed.append(os.path.join(folder, "transformers", "__init__.py"))
    elif which == "5":
        row.update(status="missing", error="no --transformers5 folder (transformers 5.23.0 not carried)")
        return row
    missing = [path for path in needed if not os.path.isfile(path)]
    if missing:
        row.update(status="missing", error="not found: " + ", ".join(missing))
    return row


def run_child(name, cmd, env, left):
    """One child's JSON rows (each tagged with the variant), or one row saying why there are none."""
    if left < 30:
        return [{"variant": name, "status": "skipped", "error": "benchmark time budget used up"}]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired as exc:
        rows = [dict(json.loads(l), variant=name) for l in (exc.stdout or b"").decode(errors="replace").splitlines()
                if l.startswith("{")]
        return rows + [{"variant": name, "status": "skipped", "error": f"timed out after {left:.0f} s"}]
    rows = [dict(json.loads(l), variant=name) for l in proc.stdout.splitlines() if l.startswith("{")]
    if not rows:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        rows = [{"variant": name, "status": "crash", "error": f"child failed (rc {proc.returncode}): {tail}"}]
    for row in rows:
        row["variant_seconds"] = round(time.monotonic() - started, 1)
    return rows


def run_variant(name, mode, zoo, extra_env, which, extra, args, deadline):
    left = deadline - time.monotonic()
    cmd = variant_command(mode, zoo, extra, args, max(30.0, min(args.per_variant, left)))
    return run_child(name, cmd, variant_env(extra_env, which, args), min(left, args.per_variant + 60))


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--zoo", action="append", default=[], help="VERSION=DIR of an unpacked unsloth-zoo release")
    p.add_argument("--transformers", default=None, help="directory holding the carried transformers 4.56.2")
    p.add_argument("--transformers5", default=None, help="directory holding the carried transformers 5.23.0")
    p.add_argument("--dims", default="large-v3")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lora", type=int, default=64)
    p.add_argument("--budget", type=float, default=420.0, help="seconds for all variants together")
    p.add_argument("--per-variant", type=float, default=90.0)
    p.add_argument("--jobs", type=int, default=1, help="variants at once (CPU self-test only: timings would mix)")
    p.add_argument("--only", default=None, help="comma list of variant names")
    p.add_argument("--dry-run", action="store_true",
                   help="run nothing: check each variant's inputs exist and record the command it would run")
    args = p.parse_args(argv)
    args.zoo = dict(item.split("=", 1) for item in args.zoo)
    if args.jobs > 1 and args.device != "cpu":
        p.error("--jobs > 1 only on the CPU: variants sharing a GPU would measure each other")
    deadline = time.monotonic() + args.budget
    rows, chosen = selected(args)
    if args.dry_run:
        for name, mode, zoo, _env, which, extra in chosen:
            rows.append(plan_variant(name, mode, zoo, which, extra, args))
            print(f"bench (dry run): {name}: {rows[-1]['status']}"
                  + (f" ({rows[-1]['error']})" if "error" in rows[-1] else ""), flush=True)
    else:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [(v[0], pool.submit(run_variant, *v, args, deadline)) for v in chosen]
            for name, future in futures:
                found = future.result()
                rows += found
                print(f"bench: {name}: " + ", ".join(f"b{r.get('batch')} {r['status']}" for r in found), flush=True)
    with open(args.out, "w") as handle:
        json.dump({"settings": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows}, handle, indent=1)
    return 1 if any(row["status"] == "missing" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
