"""hotfix benchmarks: what it costs, measured on this machine in one run.

    .venv-test/bin/python -P -m hotfix_lab.bench.run            # all benchmarks (~5-10 min on 2 busy cores)
    .venv-test/bin/python -P -m hotfix_lab.bench.run --quick    # fewer repetitions
    .venv-test/bin/python -P -m hotfix_lab.bench.run startup whisper   # a subset
    .venv-test/bin/python -P -m hotfix_lab.bench.run --threads 1 wrapper   # steadier on a shared machine

Run it with the test venv's interpreter (scripts/test.sh makes it: torch
2.13.0 CPU, transformers 4.56.2, hotfix installed from a wheel).  Every
benchmark runs its variants interleaved (A B A B ...) in the same run and
prints medians, the spread, and the ratio.  Results also go to
bench/results/<UTC time>.json (git-ignored).

Benchmarks
  startup     ``python -c pass`` with hotfix installed vs not installed
  startup-path  ``python -c "import json"`` with a 100,000-file folder on PYTHONPATH, and with 5,000 PYTHONPATH
              entries: hotfix on vs HOTFIX_DISABLE=1 in the same venv (the hook's look for third-party fixes)
  activation  first ``import transformers.models.whisper.modeling_whisper``, same two environments,
              plus the time spent inside hotfix measured in-process
  wrapper     Bart training step with reentrant checkpointing, hotfix active vs reverted
              (a call path with nothing to lift), plus the per-call cost of the wrapper
  whisper     Whisper training step at whisper-tiny dimensions (d_model 384, 4+4 layers, random
              weights, CPU): reentrant + hotfix vs use_reentrant=False vs no checkpointing
  memory      bytes saved for backward during the forward (saved_tensors_hooks, deduplicated by
              storage) and peak-RSS increase of one step (fresh process per sample), same variants
  unsloth     unsloth-zoo offload path on CPU through the test seam (tools/hotfix_lab/infra/zoo_loader.py): per step,
              bytes offloaded to host, layers offloaded, host allocations and step time, upstream
              (HOTFIX_DISABLE=1 / reverted) vs patched, on unsloth-zoo 2025.11.3, 2025.11.5, 2026.10.9
              (one child process per release; 1 torch thread unless --threads)

"hotfix installed vs not installed": two throwaway venvs (``python -m venv
--without-pip``, under $HOTFIX_BENCH_DIR, default /tmp/hotfix-bench) whose
site-packages hold symlinks to every entry of this venv's site-packages -
one with hotfix's files (package, boot module, .pth/.start, dist-info), one
without.  Same interpreter, same packages, same other .pth files; created in
about a second, reused by later runs, rebuilt when this venv changes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time

from hotfix_lab.infra.paths import REPO
from hotfix_lab.bench.bench_common import BENCH, bench_venvs, fmt, load, machine
from hotfix_lab.bench.startup_bench import bench_activation, bench_startup, bench_startup_path
from hotfix_lab.bench.training_bench import bench_memory, bench_whisper, bench_wrapper
from hotfix_lab.bench.unsloth_bench import bench_unsloth


# ---------------------------------------------------------------------------- main
ALL = ("startup", "startup-path", "activation", "wrapper", "whisper", "memory", "unsloth")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("benchmarks", nargs="*", help="any of: " + " ".join(ALL) + " (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for the in-process benchmarks (default: torch's choice; "
                             "unsloth: 1); "
                             "1 is steadier on a shared machine")
    args = parser.parse_args(argv)
    chosen = args.benchmarks or list(ALL)
    unknown = sorted(set(chosen) - set(ALL))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(ALL)}")
    q = args.quick
    reps = {"startup": 10 if q else 30, "startup-path": 5 if q else 15, "activation": 3 if q else 9, "wrapper": 5 if q else 15,
            "whisper": 3 if q else 7, "memory": 1 if q else 3, "unsloth": 5 if q else 11}

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    info = machine()
    print("hotfix benchmarks")
    for key, value in info.items():
        print(f"  {key}: {value}")
    results = {"machine": info}
    venvs = bench_venvs() if {"startup", "startup-path", "activation", "memory"} & set(chosen) else None
    for name in chosen:
        print(f"\n== {name}  (load average before: {' '.join(f'{x:.2f}' for x in load())})", flush=True)
        started = time.perf_counter()
        if name == "startup":
            out = bench_startup(reps[name], venvs)
        elif name == "startup-path":
            out = bench_startup_path(reps[name], venvs)
        elif name == "activation":
            out = bench_activation(reps[name], venvs)
        elif name == "wrapper":
            out = bench_wrapper(reps[name])
        elif name == "whisper":
            out = bench_whisper(reps[name])
        elif name == "memory":
            out = bench_memory(reps[name], venvs[0])
        else:
            out = bench_unsloth(reps[name], args.threads)
        out["seconds"] = round(time.perf_counter() - started, 1)
        out["loadavg_after"] = load()
        results[name] = out
        for key, value in out.items():
            if key.startswith("_"):  # details: in the JSON file only
                continue
            if isinstance(value, dict) and "median" in value and "unit" in value:
                print(f"  {key:<34} {fmt(value)}")
            elif isinstance(value, float):
                print(f"  {key:<34} {value:.4f}")
            else:
                print(f"  {key:<34} {value}")
    info["loadavg_end"] = load()
    out_dir = BENCH / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / (_dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + ".json")
    path.write_text(json.dumps(results, indent=1))
    print(f"\nsaved {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
