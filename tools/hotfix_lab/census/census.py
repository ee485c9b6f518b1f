#!/usr/bin/env python3
"""The census: each mechanism hotfix repairs, measured on every release line, without and with hotfix.

    python -P -m hotfix_lab.census.add_release                        # a new release into every census (its docstring)
    python -P -m hotfix_lab.census.census --jobs 2                    # every dimension: installs, runs, renders
    python -P -m hotfix_lab.census.census --dimension transformers    # or unsloth-zoo
    python -P -m hotfix_lab.census.census --render-only               # docs/versions.md from docs/census/
    .matrix/torch-2.14.1/bin/python -P -m hotfix_lab.census.census --dimension transformers --releases 4.56.2,5.23.0
                                                              # the same cells under another torch
    python -P -m hotfix_lab.census.census --torch lines --cells whisper/full,compile/whisper/eager --drop-venv
                                                              # torch lines 2.4 - 2.15 (venvs made here)

Dimensions (releases: tools/hotfix_lab/census/releases.py):
* transformers: the last patch of every minor line from 4.35 to the newest and the first release of each line
  where a declared range starts (below 4.43 the LoRA cells run an older PEFT:
  hotfix_lab.sweep.sweep_models's ``OLDER_PEFT``).  Each mechanism's cells (``CELLS``: a model type and a recipe of the
  sweep, built and checked by tools/hotfix_lab/sweep/'s worker, memory/time guard per step, a worker killed per
  model after ``--model-timeout``) run through torch's reentrant checkpoint and unsloth-zoo's
  ``UnslothCheckpointFunction`` (tools/hotfix_lab/sweep/sweep_models.py's UNSLOTH_ZOO, loaded on CPU), with hotfix
  off (HOTFIX_DISABLE=1) and on.  A float32 cell that differs only by rounding-sized values
  (tools/hotfix_lab/sweep/sweep_rounding.py, the sweep's rule too) is measured again in float64; equal there, it is
  equal (the detail says so).  A model type the release does not have is "n/a: absent".  The lab cells (``cells.LAB_CELLS``,
  tools/hotfix_lab/cases/grad_case.py) run in one child per half the same way.
* unsloth-zoo: every release from 2024.11.6 with the transformers line it was made for, through
  tools/hotfix_lab/cases/zoo_cases.py (upstream, then hotfix activated in the same process): closure tensors,
  a frozen first input, whether step 1 offloads.
* torch lines (``--torch 2.4.1,2.6.0,...`` or ``--torch lines``: every line of releases.torch_lines()):
  each torch release gets a venv of its own, .matrix/torch-<version> (PyPI's CUDA build: it runs on the
  CPU; torch, wrapt, packaging, psutil, numpy, peft, accelerate and hotfix from a wheel of this
  checkout), and the census re-runs itself there with ``--dimension torch-line``: every transformers
  and lab cell on releases.TORCH_LINE_RELEASE (or the release of that torch's time where it does not
  import), through torch's function and, where unsloth-zoo loads under that torch, unsloth's; and the
  compile column (``cells.COMPILE_CASES``: tools/hotfix_lab/cases/compile_case.py, Whisper and a Llama under
  ``torch.compile`` with the eager and inductor backends, trained two steps, gradients against an
  uncompiled step without checkpointing, dynamo's graph/break/frame/recompile counts, which
  gates.compile_problems holds equal with and without hotfix).  The release
  folders in .matrix/ (transformers, peft, unsloth-zoo) are shared by every torch venv.
  Cost, measured 2026-11-27 on the 2-core CPU machine (``--jobs 2``, a DDP census beside it): a venv takes
  1.5 - 3 minutes to install and 4.5 - 7 GB of disk; one torch line's mechanism cells and eager compile
  column 2 - 4 minutes; all twelve lines about 45 minutes, about 7 GB at a time with ``--drop-venv`` (each
  venv deleted once its rows are in).  (2026-11-25, with other jobs sharing the machine: 40 minutes a
  line.)  The inductor compile column (``--cells compile/whisper/inductor,compile/llama/inductor``): a cell
  1 - 3 minutes, a line about 4 minutes with ``--jobs 2`` (2026-11-27).
* the bisect (``--bisect``, tools/hotfix_lab/census/boundaries.py): the first patch release of each of the 34 lines
  with several, then each disagreeing cell on the releases between.  Cost, 2026-11-27, 2-core CPU machine,
  ``--jobs 2``, a low-priority sweep beside it: 44 minutes under torch 2.13.0 (29 first releases to install
  and measure, 3 between), 37 under 2.14.1 (installed already).

Rows (one per cell, compact) go to docs/census/<dimension>-torch<version>.jsonl.gz (tools/hotfix_lab/sweep/
sweep_store.py: deterministic gzip; a run appends to .sweep/census.pending.jsonl and resumes from
it).  Releases install side by side into .matrix/ (git-ignored), as scripts/test.sh does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional

from packaging.version import Version

from hotfix_lab.infra.paths import REPO, TOOLS

from hotfix_lab.census import boundaries
from hotfix_lab.census import cells
from hotfix_lab.census import releases
from hotfix_lab.sweep import sweep_store
from hotfix_lab.census.runner import MATRIX, RowSink, install, read_rows, run_jobs, torch_release

STORE = REPO / "docs" / "census"
DOC = REPO / "docs" / "versions.md"


def _group(row: Dict) -> str:
    return f"{row['dimension']}-torch{row['torch']}"


def _key(row: Dict) -> tuple:
    return (row["dimension"], row["release"], row["torch"], row["function"], row["case"], row["hotfix"])


class NoDiskForTorch(RuntimeError):
    """Too little free disk for a torch venv; its reason is also left in .matrix/torch-<version>.no-disk."""


#: free disk a torch venv's install needs: the venv (4.9 GB for 2.11.0, 5.4 for 2.7.1, 5.7 for 2.14.1,
#: measured 2026-11-27) and the wheels pip holds until it is done (about 3 GB)
TORCH_VENV_DISK = 9 * 2**30


def no_disk_marker(version: str) -> Path:
    """Where torch_venv says why it did not install ``version``; tests/conftest.py skips on it, CI included."""
    return MATRIX / f"torch-{version}.no-disk"


def torch_venv(version: str, wheel: Optional[str] = None) -> Path:
    """.matrix/torch-<version>: a venv with that torch (PyPI's build), once, and hotfix from ``wheel`` (default: a
    wheel of this checkout, built now), every time: a venv made earlier must not measure an older hotfix.
    scripts/test.sh installs the tests' side torch here.  With less free disk than TORCH_VENV_DISK it installs
    nothing and raises NoDiskForTorch (a CI machine's disk varies; a full disk mid-install helps nobody)."""
    import shutil
    import tempfile

    folder = MATRIX / f"torch-{version}"
    python = folder / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    fresh = not (folder / ".complete").exists()
    marker = no_disk_marker(version)
    marker.unlink(missing_ok=True)
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
        MATRIX.mkdir(exist_ok=True)
        free = shutil.disk_usage(MATRIX).free
        if free < TORCH_VENV_DISK:
            reason = (f"torch {version} not installed: {free / 2**30:.1f} GiB free on disk, its venv needs about "
                      f"{TORCH_VENV_DISK / 2**30:.0f} GiB (tools/hotfix_lab/census/census.py TORCH_VENV_DISK)")
            marker.write_text(reason + "\n")
            raise NoDiskForTorch(reason)
        print(f"census: installing torch=={version} into {folder}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        # The machine's pip constraints may cap torch; this venv asks for one exact release.  No pip cache: it
        # would keep another copy of the wheels (about 3 GB) after the install.
        env = dict(os.environ, PIP_CONSTRAINT="/dev/null", PIP_NO_CACHE_DIR="1")
        try:
            subprocess.run([*pip, f"torch=={version}", *TORCH_VENV_PACKAGES], check=True, env=env)
        except subprocess.CalledProcessError:
            shutil.rmtree(folder, ignore_errors=True)  # a half-installed venv is gigabytes of nothing
            raise
    with tempfile.TemporaryDirectory() as wheels:
        if not wheel:
            shutil.rmtree(REPO / "build", ignore_errors=True)  # setuptools would pack files deleted since into it
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            wheels, str(REPO)], check=True)
        built = [wheel] if wheel else [str(w) for w in Path(wheels).glob("*.whl")]
        subprocess.run([*pip, "--force-reinstall", "--no-deps", *built], check=True)
    # the lab's modules run there too (python -P -m hotfix_lab...): its .pth, written by that venv's python
    subprocess.run([str(python), "-P", "-m", "hotfix_lab.infra.pth"], env=dict(os.environ, PYTHONPATH=str(TOOLS)),
                   check=True)
    if fresh:
        subprocess.run([str(python), "-P", "-c", "import torch, wrapt, hotfix, hotfix_lab"], check=True)
        (folder / ".complete").touch()
    return python


#: what a torch venv holds besides torch and hotfix (transformers comes from .matrix/ on PYTHONPATH)
TORCH_VENV_PACKAGES = ("wrapt>=1.14", "packaging>=21", "psutil", "numpy", "peft==0.21.2", "accelerate")


def run_torch_lines(versions: List[str], argv: List[str], drop: bool) -> None:
    """The census under each torch release, in its venv (``--dimension torch-line``)."""
    import shutil

    for version in versions:
        try:
            python = torch_venv(version)
        except (subprocess.CalledProcessError, NoDiskForTorch) as exc:
            print(f"census: torch {version} could not be installed: {exc}", flush=True)
            continue
        subprocess.run([str(python), "-P", "-m", __spec__.name, *argv, "--dimension", "torch-line"], check=False)
        if drop:
            shutil.rmtree(MATRIX / f"torch-{version}", ignore_errors=True)


def _imports(version: str, extra: List[Path] = (), code: str = "import transformers.modeling_utils") -> Optional[str]:
    """None if ``code`` runs with transformers ``version`` (and ``extra``) on PYTHONPATH, else its last line."""
    from hotfix.diagnostics.children import child_env, last_line, run_python

    env = child_env(False, keep_hotfix_settings=False, pythonpath=[MATRIX / f"transformers-{version}", *extra])
    proc = run_python(["-c", code], env=env, cwd=Path("/tmp"), timeout=600)
    return None if proc.returncode == 0 else last_line(proc)[:200]


def torch_line_release() -> str:
    """releases.TORCH_LINE_RELEASE, or the release of this torch's time where that does not import."""
    install("transformers", releases.TORCH_LINE_RELEASE)
    if _imports(releases.TORCH_LINE_RELEASE) is None:
        return releases.TORCH_LINE_RELEASE
    return releases.release_of_its_time(torch_release())


def unsloth_unsupported(version: str) -> Optional[str]:
    """Why unsloth-zoo's function cannot run under this torch (None: it loads and swaps in)."""
    from hotfix_lab.sweep import sweep_models

    zoo = install("unsloth-zoo", sweep_models.UNSLOTH_ZOO)
    why = _imports(version, [zoo, TOOLS],
                   "from hotfix_lab.infra import zoo_loader; zoo_loader.install_unsloth_swap(zoo_loader.load_release())")
    return None if why is None else f"unsloth-zoo {sweep_models.UNSLOTH_ZOO} does not load under torch {torch_release()}: {why}"


def run_compile(version: str, hotfix: bool, function: str, done: set, sink, args) -> None:
    """The compile column of one (release, hotfix on/off, function): hotfix_lab.cases.compile_case, a child per case."""
    from hotfix.diagnostics.children import child_env, json_lines, last_line, run_python
    from hotfix_lab.sweep import sweep_models

    paths = [*sweep_models.release_pythonpath(version, function), TOOLS]
    env = child_env(hotfix, keep_hotfix_settings=False, pythonpath=paths, extra={"OMP_NUM_THREADS": "1"})
    for model, backend in cells.COMPILE_CASES:
        case = f"compile/{model}/{backend}"
        if (case, hotfix) in done or (args.cells and case not in args.cells):
            continue
        proc = run_python(["-P", "-m", "hotfix_lab.cases.compile_case", "--model", model, "--backend", backend,
                           "--function", function], env=env, cwd=Path("/tmp"), timeout=args.model_timeout)
        found = json_lines(proc.stdout)
        result = found[-1] if found else {"status": "error", "error": f"child exit {proc.returncode}: {last_line(proc)[:200]}"}
        sink(cells.compile_row(model, backend, result, version, hotfix, function))


def run_transformers(version: str, hotfix: bool, function: str, done: set, sink, args) -> None:
    """Every cell of one (release, hotfix on/off, function), through the sweep's worker."""
    from hotfix_lab.sweep import sweep_models

    install("transformers", version)
    peft = sweep_models.older_peft(version)
    if peft:
        install("peft", peft)
    for recipe, models in cells.by_recipe(args.cells).items():
        todo = [m for m in models if (m, recipe) not in done]
        if not todo:
            continue
        seen: set = set()

        def take(row, recipe=recipe):
            if row["model_type"].startswith("__"):
                return
            seen.add(row["model_type"])
            sink(cells.transformers_row(row, version, hotfix, function))

        worker_args = SimpleNamespace(memory_limit=args.memory_limit, time_limit=args.time_limit,
                                      model_timeout=args.model_timeout, recipes=recipe, dtype="float32")
        # a reentrant difference of rounding size is measured again in float64 (hotfix_lab.sweep.sweep_rounding)
        sweep_models.run_worker_rechecked(version, hotfix, function, todo, set(), worker_args, take, ("reentrant",))
        for model in todo:
            if model not in seen:  # the release has no such model type
                sink(cells.absent_row(model, recipe, version, hotfix, function))


def run_lab(version: str, hotfix: bool, function: str, done: set, sink, args) -> None:
    """The lab cells of one (release, hotfix on/off, function): tools/hotfix_lab/cases/grad_case.py in one child."""
    from hotfix.diagnostics.children import child_env, json_lines, last_line, run_python
    from hotfix_lab.sweep import sweep_models

    todo = [case for case, _ in cells.LAB_CELLS
            if (not args.cells or f"lab/{case}" in args.cells) and ("lab", case) not in done]
    if not todo:
        return
    install("transformers", version)
    paths = [*sweep_models.release_pythonpath(version, function), TOOLS]
    env = child_env(hotfix, keep_hotfix_settings=False, pythonpath=paths, extra={"OMP_NUM_THREADS": "1"})
    swap = ["--function", "unsloth"] if function == "unsloth" else []
    proc = run_python(["-P", "-m", "hotfix_lab.cases.grad_case", *swap, *todo], env=env, cwd=Path("/tmp"),
                      timeout=args.model_timeout)
    found = {r.get("case"): r for r in json_lines(proc.stdout)}
    for case in todo:
        result = found.get(case) or {"status": "error", "error": f"child exit {proc.returncode}: {last_line(proc)[:200]}"}
        sink(cells.lab_row(case, result, version, hotfix, function))


def run_zoo(zoo: str, transformers: str, done: set, sink, args) -> None:
    """One child: the zoo cases upstream, then with hotfix activated in the same process."""
    from hotfix.diagnostics.children import child_env, json_lines, run_python

    paths = [install("unsloth-zoo", zoo), install("transformers", transformers), TOOLS]
    names = [case for case, _ in cells.ZOO_CASES]
    env = child_env(True, keep_hotfix_settings=False, pythonpath=paths,
                    extra={"HOTFIX_DISABLE": "1", "OMP_NUM_THREADS": "1"})
    proc = run_python(["-P", "-m", "hotfix_lab.cases.zoo_cases", *names, "--activate", *names], env=env,
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


def _unsupported(version: str, hotfix: bool, function: str, why: str, sink, args) -> None:
    """Every cell of a function that cannot run under this torch: n/a, with the reason."""
    for model, recipe, _ in cells.CELLS:
        if not args.cells or f"{model}/{recipe}" in args.cells:
            sink(cells.unsupported_row(f"{model}/{recipe}", version, hotfix, function, why))
    for case, _ in cells.LAB_CELLS:
        if not args.cells or f"lab/{case}" in args.cells:
            sink(cells.unsupported_row(f"lab/{case}", version, hotfix, function, why))
    for model, backend in cells.COMPILE_CASES:
        if not args.cells or f"compile/{model}/{backend}" in args.cells:
            sink(cells.unsupported_row(f"compile/{model}/{backend}", version, hotfix, function, why, dimension="compile"))


def _describe(row: Dict) -> str:
    return (f"[{row['dimension']} {row['release']} {row['function']} hotfix {'on ' if row['hotfix'] else 'off'}]"
            f" {row['case']:<36} {row['verdict']} {row.get('detail', '')[:80]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dimension", choices=("transformers", "unsloth-zoo", "torch-line", "all"), default="all")
    p.add_argument("--torch", default="", help="comma list of torch releases, or 'lines': the census under each "
                                               "(--dimension torch-line in its own venv)")
    p.add_argument("--install-torch", default="", help="only install .matrix/torch-<version> (scripts/test.sh)")
    p.add_argument("--wheel", default=None, help="with --install-torch: the hotfix wheel to install there")
    p.add_argument("--drop-venv", action="store_true", help="with --torch: delete each torch venv after its run")
    p.add_argument("--releases", default="", help="comma list: only these releases of the dimension (with "
                                                  "--dimension transformers also others; with --bisect: the "
                                                  "lines of these releases)")
    p.add_argument("--bisect", action="store_true", help="transformers patch releases at boundaries "
                                                         "(tools/hotfix_lab/census/boundaries.py) instead of --dimension")
    p.add_argument("--functions", default="torch,unsloth")
    p.add_argument("--cells", default="", help="comma list of cells: model/recipe, lab/case, compile/model/backend "
                                               "(default: every cell)")
    p.add_argument("--remeasure", action="store_true", help="run the chosen cells again even where rows exist "
                                                           "(the newest row of a cell is the one kept)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--results", default=str(STORE), help="store directory, or a .jsonl file (tests)")
    p.add_argument("--doc", default=str(DOC))
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--memory-limit", type=int, default=2**30)
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--model-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    if args.install_torch:
        try:
            torch_venv(args.install_torch, args.wheel)
        except NoDiskForTorch as exc:
            print(f"census: {exc}", flush=True)
        return 0
    args.cells = set(filter(None, args.cells.split(",")))
    results = Path(args.results)
    if args.torch and not args.render_only:
        versions = releases.torch_lines() if args.torch == "lines" else args.torch.split(",")
        passed = [a for a in (argv if argv is not None else sys.argv[1:])]
        passed = [a for i, a in enumerate(passed) if not (a in ("--torch", "--dimension") or
                  (i and passed[i - 1] in ("--torch", "--dimension")) or a.startswith(("--torch=", "--dimension="))
                  or a == "--drop-venv")]
        run_torch_lines(versions, passed, args.drop_venv)
        args.render_only = True
    torch_version = torch_release()
    if not args.render_only:
        rows = read_rows(results)
        done = set() if args.remeasure else {_key(r) for r in rows if r["verdict"] not in cells.RETRY}
        only = set(filter(None, args.releases.split(",")))
        # a torch line's rows say so (render: the torch lines table, not a release table)
        sink = RowSink(results, torch_version, _describe, {"line": True} if args.dimension == "torch-line" else None)

        def cells_done(release, function, hotfix):
            """(model type, recipe) of the transformers cells already measured for this half."""
            return {tuple(k[4].split("/", 1)) for k in done
                    if k[:4] == ("transformers", release, torch_version, function) and k[5] == hotfix}

        def release_jobs(version, cells_args=args):
            """Every transformers and lab cell of ``version`` (``cells_args.cells``: only these), both halves."""
            return [job for function in args.functions.split(",") for hotfix in (False, True) for job in (
                lambda v=version, h=hotfix, f=function: run_transformers(v, h, f, cells_done(v, f, h), sink, cells_args),
                lambda v=version, h=hotfix, f=function: run_lab(v, h, f, cells_done(v, f, h), sink, cells_args))]

        jobs = []
        if args.bisect:  # first: each line's first patch release (its last is the census's own)
            for version in boundaries.firsts():
                if not only or set(releases.line_of(version)) & only:
                    jobs += release_jobs(version)
        elif args.dimension in ("transformers", "all"):
            # --releases may name a patch release the census does not take (a line's cells between its first
            # and last patch release that the bisect does not ask for: they keep each declared window measured)
            extra = [] if args.dimension != "transformers" else sorted(
                only - set(releases.transformers_releases()), key=Version)
            for version in releases.transformers_releases() + extra:
                if not only or version in only:
                    jobs += release_jobs(version)
        if args.dimension == "torch-line":
            version = torch_line_release()
            wanted = {c for c in args.cells or cells.MECHANISM if c not in cells.RELEASE_ONLY}
            if any(r["dimension"] == "transformers" and r["release"] == version and r["torch"] == torch_version
                   and not r.get("line") for r in rows):
                # A census torch (2.13, 2.14): the release's own rows are this line's mechanism cells.  Rows of
                # the line would replace them (same key) and empty the release's row on the page.
                print(f"census: torch {torch_version} has {version}'s release rows: its compile cells only", flush=True)
                wanted = {c for c in wanted if cells.MECHANISM.get(c) == "torch-compile"}
            line_args = SimpleNamespace(**{**vars(args), "cells": wanted})
            if wanted and (not only or version in only):  # (an empty set would mean every cell)
                unsupported = unsloth_unsupported(version) if "unsloth" in args.functions.split(",") else None
                for function in args.functions.split(","):
                    for hotfix in (False, True):
                        if function == "unsloth" and unsupported:
                            jobs.append(lambda v=version, h=hotfix, f=function: _unsupported(
                                v, h, f, unsupported, sink, line_args))
                            continue
                        jobs.append(lambda v=version, h=hotfix, f=function: run_transformers(
                            v, h, f, cells_done(v, f, h), sink, line_args))
                        jobs.append(lambda v=version, h=hotfix, f=function: run_lab(
                            v, h, f, cells_done(v, f, h), sink, line_args))
                        jobs.append(lambda v=version, h=hotfix, f=function: run_compile(
                            v, h, f, {(k[4], k[5]) for k in done if k[:4] == ("compile", v, torch_version, f)},
                            sink, line_args))
        if args.dimension in ("unsloth-zoo", "all") and not args.bisect:
            for zoo, transformers in releases.zoo_releases():
                if only and zoo not in only:
                    continue
                jobs.append(lambda z=zoo, t=transformers: run_zoo(
                    z, t, {(k[4], k[5]) for k in done if k[:4] == ("unsloth-zoo", z, torch_version, "unsloth")},
                    sink, args))
        run_jobs(jobs, args.jobs)
        if args.bisect:  # then: where a line's first and last patch release disagree, the cells between
            rows = read_rows(results)
            for version, cases in boundaries.plan(rows, torch_version).items():
                if not only or set(releases.line_of(version)) & only:
                    wanted = {c for c in cases if not args.cells or c in args.cells}
                    if not wanted:
                        continue
                    print(f"census: bisect: {version}: {', '.join(sorted(wanted))}", flush=True)
                    jobs += release_jobs(version, SimpleNamespace(**{**vars(args), "cells": wanted}))
            run_jobs(jobs, args.jobs)
        sweep_store.compact(results, _key, _group)
    from hotfix_lab.census.render import render

    render(read_rows(results), Path(args.doc))
    print(f"census: {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
