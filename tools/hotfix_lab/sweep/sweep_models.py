#!/usr/bin/env python3
"""Sweep transformers' own models through ``hotfix.checker``, with and without hotfix.

    python -P -m hotfix_lab.sweep.sweep_models --jobs 2             # full sweep: 4.56.2, 4.57.6, 5.23.0, every model type,
                                                      # torch's and unsloth's checkpoint functions
    python -P -m hotfix_lab.sweep.sweep_models --fast               # the CI subset (tests/versions/test_sweep_fast.py)
    python -P -m hotfix_lab.sweep.sweep_models --versions 4.56.2 --models bert,whisper
    python -P -m hotfix_lab.sweep.sweep_models --render-only        # rebuild docs/sweep.md from docs/sweep-results/
    python -P -m hotfix_lab.sweep.sweep_models --dtype float64      # .sweep/results-float64.jsonl and .sweep/results-float64.md
                                                      # model, inputs and (in the steps) default dtype in float64

For every transformers release asked for (installed side by side in
``.matrix/transformers-<v>`` by scripts/test.sh) and for hotfix off
(``HOTFIX_DISABLE=1``) and on, a worker interpreter with that release first on
PYTHONPATH takes every model type of ``MODEL_MAPPING_NAMES`` (the base model
class, one per type), keeps those whose class ``supports_gradient_checkpointing``,
builds it on CPU from its config class's defaults shrunk to a tiny size
(``sweep_worker.shrink_config``), makes a dummy batch from ``main_input_name`` and
the forward signature (``sweep_worker.dummy_batch``), prepares it for each recipe
(``sweep_recipes``: full fine-tuning, LoRA on the attention projections with the
base frozen with and without ``enable_input_require_grads()``, a frozen
vision/audio tower) and runs ``hotfix.diagnostics.checker.check_model`` with the
reentrant and non-reentrant modes (the model's own loss, else a fixed random
projection of every float output: ``sweep_inputs.sweep_loss``), through each
checkpoint function (``--functions``: torch's, and unsloth-zoo's
UnslothCheckpointFunction loaded on CPU, reentrant only).  A float32 row whose every failing
mode differs by rounding-sized values only is measured again in float64 (``run_worker_rechecked``,
``sweep_rounding``: the census's rule too) and passes where it is equal there.  Families the generic
small config does not fit get their sizes and inputs from ``sweep_families/``;
``sweep_probe.py`` measures the builder's reach in minutes.  Models that cannot be
built or run are listed as such.  Each worker is bounded per model (``--model-timeout``) and by
the checker's memory and time guards; a model that kills or hangs its worker is
recorded and the worker restarted after it.  ``--jobs N`` runs N (release,
hotfix on/off) workers at once.

Results go to ``--results`` (JSON lines; an interrupted sweep resumes where it
stopped) and the table to ``--doc`` (docs/sweep.md).

The timm-tower types (Gemma-3n, FastVLM, PerceptionLM) need timm, which needs torchvision, which
PyPI has for torch 2.14.1 (a CUDA build; it runs on the CPU) and not for 2.13.0.  They are swept
from a venv with that torch (the census's .matrix/torch-2.14.1, tools/hotfix_lab/census/census.py) and timm beside
it, each row recording its torch:

    .matrix/torch-2.14.1/bin/pip install --no-deps --target .matrix/timm-torch2.14.1 torchvision==0.29.1 timm==1.0.31
    touch .matrix/timm-torch2.14.1/.complete
    .matrix/torch-2.14.1/bin/python -P -m hotfix_lab.sweep.sweep_models --models gemma3n,fast_vlm,perception_lm --jobs 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional

from packaging.version import Version

from hotfix_lab.sweep.sweep_recipes import RECIPES
from hotfix_lab.sweep import sweep_rounding
from hotfix_lab.sweep import sweep_store
from hotfix_lab.sweep.sweep_report import (DONE, _cell, census, compact_results, compact_table, function_of, load_results, recipe_of,
                          render)
from hotfix_lab.sweep.sweep_worker import FUNCTION_MODES, census_main, worker_main

from hotfix_lab.infra.paths import REPO, TOOLS

MATRIX = REPO / ".matrix"
RESULTS = REPO / "docs" / "sweep-results"  # the tracked store: one .jsonl.gz per release line (sweep_store)
DEFAULT_VERSIONS = ["4.56.2", "4.57.6", "5.23.0"]
FAST_VERSIONS = ["4.56.2"]
# The CI subset: two models hotfix fixes, two that were never broken.
FAST_MODELS = ["bert", "layoutlm", "deberta-v2", "whisper"]
#: the unsloth-zoo release whose UnslothCheckpointFunction the ``unsloth`` function runs (latest in tests/matrix.txt)
UNSLOTH_ZOO = "2026.10.9"
#: (first transformers release the test venv's PEFT imports with, the PEFT the LoRA recipes run below it):
#: PEFT >= 0.14 imports transformers' EncoderDecoderCache (4.43+); 0.12.0 is the newest that imports with
#: every release from 4.35.0 (0.13 needs huggingface_hub.errors, newer than 4.35.0's tokenizers allow).
#: Installed into .matrix/peft-<v> by the census (hotfix_lab.census.census), the only tool that goes below 4.43.
OLDER_PEFT = ("4.43.0", "0.12.0")


def older_peft(version: str) -> Optional[str]:
    """The PEFT release the LoRA recipes need on transformers ``version``, or None for the test venv's own."""
    return OLDER_PEFT[1] if Version(version) < Version(OLDER_PEFT[0]) else None


def release_pythonpath(version: str, function: str = "torch") -> List[Path]:
    """PYTHONPATH of a sweep child: the transformers release, the sweep-only extras (pillow, scipy, and where
    it was installed for this interpreter's torch, timm with its torchvision: .matrix/timm-torch<release>), for
    the ``unsloth`` function the unsloth-zoo release, below 4.43 an older PEFT (``OLDER_PEFT``), and the lab."""
    paths = [MATRIX / f"transformers-{version}"] + ([MATRIX / f"unsloth-zoo-{UNSLOTH_ZOO}"] if function == "unsloth" else [])
    peft = older_peft(version)
    if peft:
        paths.append(MATRIX / f"peft-{peft}")
    for path in paths:
        if not (path / ".complete").exists():
            raise SystemExit(f"{path} is not installed; run scripts/test.sh first")
    extras = sorted(p for pattern in ("pillow-*", "scipy-*", f"timm-torch{_torch_release()}")
                    for p in MATRIX.glob(pattern) if (p / ".complete").exists())
    return [*paths, *extras, TOOLS]  # TOOLS: the child runs hotfix_lab.sweep


def _torch_release() -> str:
    """The torch release this interpreter has (timm's folder goes with the torchvision built for it)."""
    from importlib.metadata import version

    return version("torch").split("+")[0]


def _reader(stream, q):
    for line in stream:
        q.put(line)
    q.put(None)


def run_worker(version: str, hotfix_on: bool, function: str, models: Optional[List[str]], done: set, args,
               sink) -> None:
    """Run workers for one (version, hotfix, checkpoint function) until every model type is recorded."""
    from hotfix.diagnostics.children import child_env

    env = child_env(hotfix_on, keep_hotfix_settings=False, pythonpath=release_pythonpath(version, function),
                    extra={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    scratch = Path(tempfile.mkdtemp(prefix="hotfix-sweep-"))  # never write into tests/
    scratch.mkdir(parents=True, exist_ok=True)
    skip = set(done)
    while True:
        cmd = [sys.executable, "-P", "-m", __spec__.name, "--worker", "--memory-limit", str(args.memory_limit),
               "--time-limit", str(args.time_limit), "--recipes", args.recipes, "--function", function,
               "--dtype", args.dtype]
        if models:
            cmd += ["--models", ",".join(models)]
        if skip:
            cmd += ["--skip", ",".join(sorted(skip))]
        proc = subprocess.Popen(cmd, env=env, cwd=str(scratch), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        q: "queue.Queue" = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
        current, deadline, finished = None, time.monotonic() + args.model_timeout + 120, False
        recorded: set = set()  # recipes of the current model already reported
        while True:
            try:
                line = q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = "TIMEOUT"
            if line is None or line == "TIMEOUT":
                if line == "TIMEOUT":
                    proc.kill()
                proc.wait()
                if current is not None:
                    why = (f"worker killed after {args.model_timeout:.0f} s" if line == "TIMEOUT"
                           else f"worker died (exit {proc.returncode})")
                    for recipe in [r for r in args.recipes.split(",") if r not in recorded]:
                        sink({"model_type": current, "recipe": recipe, "result": "timeout" if line == "TIMEOUT"
                              else "died", "detail": why, "transformers": version, "hotfix": hotfix_on,
                              "function": function})
                    skip.add(current)
                break
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "start" in msg:
                current, deadline, recorded = msg["start"], time.monotonic() + args.model_timeout, set()
            elif "row" in msg:
                msg["row"]["transformers"] = version
                sink(msg["row"])
                recorded.add(msg["row"].get("recipe", "full"))
            elif "finished" in msg:
                skip.add(msg["finished"])
                current = None
            elif msg.get("done"):
                finished = True
                sink({"model_type": "__done__", "result": "marker", "transformers": version, "hotfix": hotfix_on,
                      "function": function})
        if finished or current is None and proc.returncode == 0:
            return
        if current is None:  # died between models
            return


def run_worker_rechecked(version: str, hotfix_on: bool, function: str, models: Optional[List[str]], done: set,
                         args, sink, modes=None) -> None:
    """run_worker, then the float32 rows whose failing modes (of ``modes``; None: every mode) differ by rounding-sized
    values only measured again in float64 (sweep_rounding: the rule the census uses too).  Each row reaches
    ``sink`` once, settled; the half's end marker last, so a run stopped before the float64 pass resumes it."""
    if args.dtype != "float32":
        return run_worker(version, hotfix_on, function, models, done, args, sink)
    held: dict = {}  # (model type, recipe) -> float32 row to measure again
    markers: list = []

    def take(row):
        if row["model_type"] == "__done__":
            markers.append(row)
        elif sweep_rounding.rounding_modes(row, modes):
            held[(row["model_type"], recipe_of(row))] = row
        else:
            sink(row)

    def take_float64(row):
        held_row = held.pop((row["model_type"], recipe_of(row)), None)
        if held_row is not None:
            sink(sweep_rounding.settle(held_row, row, modes))

    run_worker(version, hotfix_on, function, models, done, args, take)
    if held:
        again = argparse.Namespace(**dict(vars(args), dtype="float64",
                                          recipes=",".join(sorted({recipe for _, recipe in held}))))
        run_worker(version, hotfix_on, function, sorted({model for model, _ in held}), set(), again, take_float64)
        for row in list(held.values()):  # the float64 worker gave no row: the float32 verdict stands, said so
            sink(sweep_rounding.settle(row, None, modes))
    for marker in markers:
        sink(marker)


def take_census(version: str) -> dict:
    """Every model type of the release: does its base class declare supports_gradient_checkpointing?"""
    from hotfix.diagnostics.children import child_env, json_lines, run_python

    env = child_env(False, keep_hotfix_settings=False, pythonpath=release_pythonpath(version),
                    extra={"OMP_NUM_THREADS": "1"})
    proc = run_python(["-P", "-m", __spec__.name, "--census"], env=env, cwd=tempfile.gettempdir(), timeout=1800)
    found = [line["census"] for line in json_lines(proc.stdout) if "census" in line]
    if not found:
        raise SystemExit(f"census of transformers {version} failed: {proc.stderr[-2000:]}")
    return found[-1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--skip", default="", help=argparse.SUPPRESS)
    p.add_argument("--census", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fast", action="store_true", help=f"CI subset: {','.join(FAST_MODELS)} on {FAST_VERSIONS}")
    p.add_argument("--versions", default=None, help="comma list (default: %s)" % ",".join(DEFAULT_VERSIONS))
    p.add_argument("--models", default="", help="comma list of model types (default: all)")
    p.add_argument("--results", default=None, help="JSON-lines results file, or a store directory (default: docs/sweep-results/)")
    p.add_argument("--doc", default=None, help="markdown table to write (default: docs/sweep.md)")
    p.add_argument("--fresh", action="store_true", help="ignore earlier results instead of resuming")
    p.add_argument("--no-census", action="store_true",
                   help="skip the census of the release's model types (a child, ~25 s): the page's coverage then "
                        "counts only the types that ran, and says so (for runs of a few named models)")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--readme-table", default="", metavar="TYPES",
                   help="print the README's compact table for these model types (comma list) and stop")
    p.add_argument("--hotfix", choices=("off", "on", "both"), default="both",
                   help="run only the unpatched (HOTFIX_DISABLE=1) or patched half (to run them in parallel)")
    p.add_argument("--memory-limit", type=int, default=2**30, help="bytes of RSS growth per step (default 1 GiB)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per step (default 60)")
    p.add_argument("--model-timeout", type=float, default=600.0,
                   help="seconds per model (all its recipes) before the worker is killed")
    p.add_argument("--recipes", default=",".join(RECIPES), help="comma list (default: %(default)s)")
    p.add_argument("--functions", default=None,
                   help="checkpoint functions, comma list of %s (default: all; --fast: torch)" % ",".join(FUNCTION_MODES))
    p.add_argument("--function", default="torch", choices=tuple(FUNCTION_MODES), help=argparse.SUPPRESS)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="model, float inputs and torch's default dtype in the steps (every run re-measures rounding-sized "
                        "float32 differences in float64 by itself: sweep_rounding)")
    p.add_argument("--jobs", type=int, default=1, help="(release, hotfix on/off) workers run at once (default 1)")
    args = p.parse_args(argv)
    if args.census:
        return census_main()
    if args.worker:
        return worker_main(args)
    versions = (args.versions.split(",") if args.versions else FAST_VERSIONS if args.fast else DEFAULT_VERSIONS)
    models = args.models.split(",") if args.models else (FAST_MODELS if args.fast else None)
    # --fast and float64 runs never write into the float32 results or docs/sweep.md unless told to.
    side_run = "fast" if args.fast else "results-float64" if args.dtype == "float64" else None
    # The main results are tracked (docs/sweep-results/): they are the evidence behind docs/sweep.md and a
    # sweep takes hours, so they must outlive a checkout; side runs stay in the ignored .sweep/.
    results_path = Path(args.results or (REPO / ".sweep" / f"{side_run}.jsonl" if side_run else RESULTS))
    doc = Path(args.doc or (REPO / ".sweep" / f"{side_run}.md" if side_run else REPO / "docs" / "sweep.md"))
    if args.fresh and results_path.exists() and not sweep_store.is_store(results_path):
        results_path.unlink()
    results = load_results(results_path)
    appended = sweep_store.append_target(results_path)  # a running sweep appends here (resumable)
    appended.parent.mkdir(parents=True, exist_ok=True)
    import torch

    recipes = args.recipes.split(",")
    if args.readme_table:
        print(compact_table(results, args.readme_table.split(","), versions, recipes))
        return 0
    unknown = sorted(set(recipes) - set(RECIPES))
    if unknown:
        p.error(f"unknown recipe(s) {unknown}; known: {list(RECIPES)}")
    functions = args.functions.split(",") if args.functions else (["torch"] if args.fast else list(FUNCTION_MODES))
    if set(functions) - set(FUNCTION_MODES):
        p.error(f"unknown function(s) {sorted(set(functions) - set(FUNCTION_MODES))}; known: {list(FUNCTION_MODES)}")
    if not args.render_only:
        lock = threading.Lock()

        for version in versions:
            if not args.no_census and census(results, version) is None:
                row = dict(take_census(version), model_type="__census__", transformers=version)
                results.append(row)
                with appended.open("a") as f:
                    f.write(json.dumps(row) + "\n")

        def run_half(version, hotfix_on, function):
            have: dict = {}
            for r in results:
                # resume: a cell counts as done once checked (or not applicable); what could not be built,
                # run, or finish is tried again (the builder may have learnt it since)
                if r["transformers"] == version and bool(r.get("hotfix")) == hotfix_on and function_of(r) == function \
                        and r.get("dtype", "float32") == args.dtype and r.get("result") in DONE + ("no-checkpointing",) \
                        and not sweep_rounding.rounding_modes(r):  # a row from before the float64 re-check: again
                    have.setdefault(r["model_type"], set()).add(recipe_of(r))
            done = {t for t, got in have.items() if set(recipes) <= got}

            def sink(row):
                row["date"] = datetime.date.today().isoformat()
                row["hotfix"] = bool(row.get("hotfix", hotfix_on))
                row["function"] = function
                if args.dtype != "float32":  # rows without the key are float32, as before the option
                    row["dtype"] = args.dtype
                with lock:
                    results.append(row)
                    with appended.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"[{row['transformers']} {function:<7} hotfix {'on ' if hotfix_on else 'off'}] {row['model_type']:<28} "
                          f"{recipe_of(row):<17} {_cell(row)[:100]}", flush=True)

            run_worker_rechecked(version, hotfix_on, function, models, done, args, sink)

        halves = [(v, on, f) for f in functions for v in versions
                  for on in {"off": (False,), "on": (True,), "both": (False, True)}[args.hotfix]]
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for future in [pool.submit(run_half, v, on, f) for v, on, f in halves]:
                future.result()
        compact_results(results_path)
        # the page is rendered from the file as any later --render-only reads it: rows appended by this run are
        # marked (mark_upstream_crashes) only when loaded, so the in-memory list would under-count them
        results = load_results(results_path)
    # every line and function the results hold, not only this run's: a run of one line must not drop the others'
    # sections from the page (columns appear only where a function ran)
    shown = sorted(set(versions) | {r["transformers"] for r in results}, key=Version)
    summary = render(results, doc, shown, torch.__version__, recipes, list(FUNCTION_MODES))
    print(json.dumps(summary, indent=1))
    print(f"table: {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
