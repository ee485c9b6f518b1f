"""The largest batch each benchmark variant trains (one step), with a time limit per probe.

    python -P -m hotfix_lab.gpu.fit --out fit.json --zoo 2025.11.3=DIR --transformers DIR --transformers5 DIR

Per variant (tools/hotfix_lab/gpu/bench.py's, in this order: non-reentrant, hotfix+zoo-2025.11.3,
hf-offload, none) one interpreter runs tools/hotfix_lab/gpu/whisper_steps.py ``--batches search``:
one training step per batch size, doubling from ``--from`` while it fits, then bisecting
between the last size that fit and the first that ran out of memory (to 1/16 of the fit).
Each probe prints its line when it ends; a probe that prints nothing within
``--probe-limit`` seconds (the first also gets the interpreter's start-up) is stopped
and recorded as not measured, as is everything the variant's or the run's time left
does not reach.  The figure reported is "fits N" with what bounds it: "out of memory at
M" (measured), or "M not measured" (a time limit), never a guess.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

from hotfix_lab.gpu import bench  # (the variant table and how a variant's child is started)

ORDER = ("non-reentrant", "hotfix+zoo-2025.11.3", "hf-offload", "none")
STARTUP_S = 60.0  # interpreter, CUDA context and model before the first probe


def summarize(name, probes, stopped):
    """One variant's verdict from its probe lines and why it stopped (None: the search ended itself)."""
    fits = [p["batch"] for p in probes if p.get("status") == "ok"]
    ooms = [p["batch"] for p in probes if p.get("status") == "oom"]
    crashes = [p for p in probes if p.get("status") == "crash"]
    largest = max(fits) if fits else None
    above = min((b for b in ooms if largest is None or b > largest), default=None)
    row = {"variant": name, "largest_fit": largest, "first_oom_above": above, "probes": probes}
    if crashes:
        row["verdict"] = f"crash at batch {crashes[0]['batch']}: {crashes[0].get('error')}"
    elif largest is None and above is None:
        row["verdict"] = "not measured" + (f" ({stopped})" if stopped else "")
    elif above is not None:
        row["verdict"] = (f"fits {largest}, out of memory at {above}" if largest is not None
                          else f"out of memory at {above} (nothing smaller probed)")
    else:
        row["verdict"] = f"fits {largest}; above it " + (f"not measured ({stopped})" if stopped
                                                           else "not probed (search limit)")
    return row


def search(name, cmd, env, probe_limit, until):
    """Run one variant's search; (probe rows, why it was stopped or None)."""
    errors = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
    probes, stopped, limit, in_flight = [], None, probe_limit + STARTUP_S, None
    while True:
        wait = min(limit, until - time.monotonic())
        try:
            line = lines.get(timeout=max(wait, 0.1))
        except queue.Empty:
            stopped = (f"no result within {limit:.0f} s" if wait >= limit else "the variant's time was used up")
            if in_flight is not None:
                stopped = f"batch {in_flight}: {stopped}"
            break
        if line is None:
            break
        if line.startswith("{"):
            found = json.loads(line)
            if "probing" in found:
                in_flight = found["probing"]
            else:
                probes.append(found)
                limit, in_flight = probe_limit, None
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if not probes and stopped is None:  # the child ended before its first probe: say how
        errors.seek(0)
        stopped = f"rc {proc.returncode}: " + ((errors.read().strip().splitlines() or ["no output"])[-1][:200])
    errors.close()
    return probes, stopped


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--zoo", action="append", default=[])
    p.add_argument("--transformers", default=None)
    p.add_argument("--transformers5", default=None)
    p.add_argument("--dims", default="large-v3")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--lora", type=int, default=64)
    p.add_argument("--from", dest="start", type=int, default=64, help="first batch size probed")
    p.add_argument("--limit", type=int, default=4096, help="never probe above this batch size")
    p.add_argument("--probe-limit", type=float, default=60.0, help="seconds one probe may take")
    p.add_argument("--per-variant", type=float, default=100.0)
    p.add_argument("--budget", type=float, default=330.0, help="seconds for all variants together")
    p.add_argument("--only", default=None)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    args.zoo = dict(item.split("=", 1) for item in args.zoo)
    deadline = time.monotonic() + args.budget
    table = {v[0]: v for v in bench.VARIANTS}
    rows = []
    for name in ORDER:
        if args.only and name not in args.only.split(","):
            continue
        _, mode, zoo, env, which, extra = table[name]
        if zoo and zoo not in args.zoo:
            rows.append({"variant": name, "verdict": f"not measured (unsloth-zoo {zoo} not carried)",
                         "status": "missing" if args.dry_run else "skipped"})
            continue
        bench_args = argparse.Namespace(dims=args.dims, dtype=args.dtype, device=args.device, steps=1, lora=args.lora,
                                        batches="search", zoo=args.zoo, transformers=args.transformers,
                                        transformers5=args.transformers5, per_variant=args.per_variant)
        cmd = bench.variant_command(mode, zoo, extra, bench_args, args.per_variant, compare=False) + [
            "--search-from", str(args.start), "--search-limit", str(args.limit)]
        if args.dry_run:
            planned = bench.plan_variant(name, mode, zoo, which, extra, bench_args)
            rows.append(dict(planned, command=cmd))
            print(f"fit (dry run): {name}: {planned['status']}", flush=True)
            continue
        left = deadline - time.monotonic()
        if left < 30:
            rows.append({"variant": name, "verdict": "not measured (the run's time budget was used up)"})
            continue
        started = time.monotonic()
        probes, stopped = search(name, cmd, bench.variant_env(env, which, bench_args), args.probe_limit,
                                 time.monotonic() + min(left, args.per_variant))
        rows.append(dict(summarize(name, probes, stopped), seconds=round(time.monotonic() - started, 1)))
        print(f"fit: {name}: {rows[-1]['verdict']}", flush=True)
    with open(args.out, "w") as handle:
        json.dump({"settings": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows}, handle, indent=1)
    return 1 if any(row.get("status") == "missing" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
