#!/usr/bin/env python3
"""The census: each mechanism hotfix repairs, measured on every release line, without and with hotfix.

    python tools/census/census.py --jobs 2                    # every dimension: installs, runs, renders
    python tools/census/census.py --dimension transformers    # or unsloth-zoo
    python tools/census/census.py --render-only               # docs/versions.md from docs/census/
    .venv-torch214/bin/python tools/census/census.py --dimension transformers --releases 4.56.2,5.23.0
                                                              # the same cells under another torch

Dimensions (releases: tools/census/releases.py):
* transformers: the last patch of every minor line 4.35 - 5.23 and the first release of each line
  where a declared range starts (below 4.43 the LoRA cells run an older PEFT:
  tools/sweep/sweep_models.py's ``OLDER_PEFT``).  Each mechanism's cells (``CELLS``: a model type and a recipe of the
  sweep, built and checked by tools/sweep/'s worker, memory/time guard per step, a worker killed per
  model after ``--model-timeout``) run through torch's reentrant checkpoint and unsloth-zoo's
  ``UnslothCheckpointFunction`` (tools/sweep/sweep_models.py's UNSLOTH_ZOO, loaded on CPU), with hotfix
  off (HOTFIX_DISABLE=1) and on.  A float32 cell that differs only by rounding-sized values
  (``cells.rounding_sized``) is measured again in float64; equal there, it is equal (the detail says
  so).  A model type the release does not have is "n/a: absent".  The lab cells (``cells.LAB_CELLS``,
  tools/lab/grad_case.py) run in one child per half the same way.
* unsloth-zoo: every release from 2024.11.6 with the transformers line it was made for, through
  tools/lab/zoo_cases.py (upstream, then hotfix activated in the same process): closure tensors,
  a frozen first input, whether step 1 offloads.

Rows (one per cell, compact) go to docs/census/<dimension>-torch<version>.jsonl.gz (tools/sweep/
sweep_store.py: deterministic gzip; a run appends to .sweep/census.pending.jsonl and resumes from
it).  Releases install side by side into .matrix/ (git-ignored), as scripts/test.sh does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "tools" / "sweep"), str(REPO / "tools" / "lab")]

import cells  # noqa: E402
import releases  # noqa: E402
import sweep_store  # noqa: E402

STORE = REPO / "docs" / "census"
DOC = REPO / "docs" / "versions.md"
MATRIX = REPO / ".matrix"


def _group(row: Dict) -> str:
    return f"{row['dimension']}-torch{row['torch']}"


def _key(row: Dict) -> tuple:
    return (row["dimension"], row["release"], row["torch"], row["function"], row["case"], row["hotfix"])


_INSTALLING = threading.Lock()  # jobs of one release run side by side: one installs, the other waits


def install(name: str, version: str) -> Path:
    """``name==version`` in .matrix/<name>-<version> (with its dependencies for transformers), once."""
    folder = MATRIX / f"{name}-{version}"
    with _INSTALLING:
        if not (folder / ".complete").exists():
            _pip_install(name, version, folder)
    return folder


def _pip_install(name: str, version: str, folder: Path) -> None:
    if folder.exists():
        import shutil

        shutil.rmtree(folder)  # a half-finished install
    spec = f"{name.replace('-', '_') if name == 'unsloth-zoo' else name}=={version}"
    extra = ["--no-deps"] if name in ("unsloth-zoo", "peft") else []  # their needs are the test venv's
    print(f"census: installing {spec}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *extra,
                           "--target", str(folder), spec], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install {spec} failed: {proc.stderr.strip().splitlines()[-1:]}")
    (folder / ".complete").touch()


def _torch() -> str:
    import torch

    return torch.__version__.split("+")[0]


def run_transformers(version: str, hotfix: bool, function: str, done: set, sink, args) -> None:
    """Every cell of one (release, hotfix on/off, function), through the sweep's worker."""
    import sweep_models

    install("transformers", version)
    peft = sweep_models.older_peft(version)
    if peft:
        install("peft", peft)
    for recipe, models in cells.by_recipe(args.cells).items():
        todo = [m for m in models if (m, recipe) not in done]
        if not todo:
            continue
        seen: set = set()
        held: Dict[str, Dict] = {}  # model type -> its float32 row, differing by rounding-sized values only

        def take(row, recipe=recipe):
            if row["model_type"].startswith("__"):
                return
            seen.add(row["model_type"])
            if cells.rounding_sized(row):
                held[row["model_type"]] = row
            else:
                sink(cells.transformers_row(row, version, hotfix, function))

        def take_float64(row):
            if row["model_type"] in held:
                sink(cells.transformers_row(held.pop(row["model_type"]), version, hotfix, function, float64=row))

        worker_args = SimpleNamespace(memory_limit=args.memory_limit, time_limit=args.time_limit,
                                      model_timeout=args.model_timeout, recipes=recipe, dtype="float32")
        sweep_models.run_worker(version, hotfix, function, todo, set(), worker_args, take)
        if held:
            worker_args.dtype = "float64"
            sweep_models.run_worker(version, hotfix, function, sorted(held), set(), worker_args, take_float64)
            for row in held.values():  # the float64 worker gave no row: keep the float32 verdict, said so
                sink(cells.transformers_row(row, version, hotfix, function, float64={"result": "no float64 row"}))
        for model in todo:
            if model not in seen:  # the release has no such model type
                sink(cells.absent_row(model, recipe, version, hotfix, function))


def run_lab(version: str, hotfix: bool, function: str, done: set, sink, args) -> None:
    """The lab cells of one (release, hotfix on/off, function): tools/lab/grad_case.py in one child."""
    from hotfix.diagnostics.children import child_env, json_lines, last_line, run_python
    import sweep_models

    todo = [case for case, _ in cells.LAB_CELLS
            if (not args.cells or f"lab/{case}" in args.cells) and ("lab", case) not in done]
    if not todo:
        return
    install("transformers", version)
    paths = [*sweep_models.release_pythonpath(version, function), REPO / "tools" / "lab"]
    env = child_env(hotfix, keep_hotfix_settings=False, pythonpath=paths, extra={"OMP_NUM_THREADS": "1"})
    swap = ["--function", "unsloth"] if function == "unsloth" else []
    proc = run_python([str(REPO / "tools" / "lab" / "grad_case.py"), *swap, *todo], env=env, cwd=Path("/tmp"),
                      timeout=args.model_timeout)
    found = {r.get("case"): r for r in json_lines(proc.stdout)}
    for case in todo:
        result = found.get(case) or {"status": "error", "error": f"child exit {proc.returncode}: {last_line(proc)[:200]}"}
        sink(cells.lab_row(case, result, version, hotfix, function))


def run_zoo(zoo: str, transformers: str, done: set, sink, args) -> None:
    """One child: the zoo cases upstream, then with hotfix activated in the same process."""
    from hotfix.diagnostics.children import child_env, json_lines, run_python

    paths = [install("unsloth-zoo", zoo), install("transformers", transformers), REPO / "tools" / "lab"]
    names = [case for case, _ in cells.ZOO_CASES]
    env = child_env(True, keep_hotfix_settings=False, pythonpath=paths,
                    extra={"HOTFIX_DISABLE": "1", "OMP_NUM_THREADS": "1"})
    proc = run_python([str(REPO / "tools" / "lab" / "zoo_cases.py"), *names, "--activate", *names], env=env,
                      cwd=Path("/tmp"), timeout=args.model_timeout)
    found = {(r.get("phase"), r.get("case")): r for r in json_lines(proc.stdout)}
    for case, _mechanism in cells.ZOO_CASES:
        for hotfix, phase in ((False, "upstream"), (True, "hotfix")):
            if (f"zoo/{case}", hotfix) in done:
                continue
            result = found.get((phase, case))
            if result is None:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
                result = {"status": "error", "error": f"child exit {proc.returncode}: {tail}"}
            sink(cells.zoo_row(case, result, zoo, transformers, hotfix))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dimension", choices=("transformers", "unsloth-zoo", "all"), default="all")
    p.add_argument("--releases", default="", help="comma list: only these releases of the dimension")
    p.add_argument("--functions", default="torch,unsloth")
    p.add_argument("--cells", default="", help="comma list of model/recipe cells (default: every cell)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--results", default=str(STORE), help="store directory, or a .jsonl file (tests)")
    p.add_argument("--doc", default=str(DOC))
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--memory-limit", type=int, default=2**30)
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--model-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    args.cells = set(filter(None, args.cells.split(",")))
    results = Path(args.results)
    torch_version = _torch()
    if not args.render_only:
        rows = [json.loads(line) for line in sweep_store.read_lines(results)]
        done = {_key(r) for r in rows if r["verdict"] not in cells.RETRY}
        appended = sweep_store.append_target(results)
        appended.parent.mkdir(parents=True, exist_ok=True)
        lock = threading.Lock()
        only = set(filter(None, args.releases.split(",")))

        def sink(row):
            row.update(torch=torch_version, date=datetime.date.today().isoformat())
            with lock:
                with appended.open("a") as handle:
                    handle.write(json.dumps(row, sort_keys=True) + "\n")
                print(f"[{row['dimension']} {row['release']} {row['function']} hotfix {'on ' if row['hotfix'] else 'off'}]"
                      f" {row['case']:<36} {row['verdict']} {row.get('detail', '')[:80]}", flush=True)

        def cells_done(release, function, hotfix):
            """(model type, recipe) of the transformers cells already measured for this half."""
            return {tuple(k[4].split("/", 1)) for k in done
                    if k[:4] == ("transformers", release, torch_version, function) and k[5] == hotfix}

        jobs = []
        if args.dimension in ("transformers", "all"):
            for version in releases.transformers_releases():
                if only and version not in only:
                    continue
                for function in args.functions.split(","):
                    for hotfix in (False, True):
                        jobs.append(lambda v=version, h=hotfix, f=function: run_transformers(
                            v, h, f, cells_done(v, f, h), sink, args))
                        jobs.append(lambda v=version, h=hotfix, f=function: run_lab(
                            v, h, f, cells_done(v, f, h), sink, args))
        if args.dimension in ("unsloth-zoo", "all"):
            for zoo, transformers in releases.zoo_releases():
                if only and zoo not in only:
                    continue
                jobs.append(lambda z=zoo, t=transformers: run_zoo(
                    z, t, {(k[4], k[5]) for k in done if k[:4] == ("unsloth-zoo", z, torch_version, "unsloth")},
                    sink, args))
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for future in [pool.submit(job) for job in jobs]:
                try:
                    future.result()
                except Exception as exc:  # one release failing to install or run must not stop the census
                    print(f"census: {exc!r}", flush=True)
        sweep_store.compact(results, _key, _group)
    from render import render

    render([json.loads(line) for line in sweep_store.read_lines(results)], Path(args.doc))
    print(f"census: {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
