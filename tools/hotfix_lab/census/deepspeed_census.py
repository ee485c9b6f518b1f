#!/usr/bin/env python3
"""DeepSpeed ZeRO-2 / ZeRO-3 with gradient checkpointing: every DeepSpeed minor line, per census torch (issue 42, part 2).

    python -P -m hotfix_lab.census.deepspeed_census                                   # install, measure, bisect, store, render
    python -P -m hotfix_lab.census.deepspeed_census --columns upstream                # hotfix off only (the fix not installed yet)
    .matrix/torch-2.14.1/bin/python -P -m hotfix_lab.census.deepspeed_census          # the other census torch
    python -P -m hotfix_lab.census.deepspeed_census --releases 0.19.2,0.19.3 --remeasure
    python -P -m hotfix_lab.census.deepspeed_census --render-only

Which releases: the last release of the lines before 0.12, the first and the last patch release of every line
from 0.12 (PyPI's upload list, cached with the census's in tools/hotfix_lab/census/pypi-releases.json: ``--refresh`` re-reads
it, ``releases.refresh``), and, where
the first and the last of a line disagree in any cell, the releases between them by bisection until each boundary
lies between two adjacent releases (``open_bisections``).  Each release is installed as tests/matrix.txt's is: its
sdist, ``DS_BUILD_OPS=0`` (no C++ op built), ``--no-deps`` into .matrix/deepspeed-<version> (git-ignored); the
0.10 line also gets the ``pydantic<2.0.0`` it requires (its setup.py imports it).

Per release and torch, first a probe: ``import deepspeed`` and its CPU accelerator (``DS_ACCELERATOR=cpu``).  A
release where that fails "does not run" with this torch: one row with the error's last line, no case.  Otherwise
two launches of tools/hotfix_lab/cases/deepspeed_cases.py under torchrun (2 ranks, gloo on 127.0.0.1, DeepSpeed's CPU
accelerator, transformers ``TRANSFORMERS`` from .matrix/ first on PYTHONPATH): hotfix off (HOTFIX_DISABLE=1) and
on, over ``CASES``: ZeRO-2 and ZeRO-3, the tiny Whisper and the tiny Llama decoder, LoRA (frozen base parameters)
and every parameter, reentrant and non-reentrant; each case trains two steps against the same steps without
checkpointing (every trainable gradient after the first backward, every parameter after the second, both ranks).
``LOCAL_SIZE=2`` as DeepSpeed's own launcher sets it (``RANKS``).  About 2 minutes per launch on the 2-core CPU
machine; one launch at a time.

Rows: docs/census/deepspeed/torch<version>.jsonl.gz (hotfix_lab.sweep.sweep_store).  The page: docs/census/deepspeed.md.
``gate_problems()`` holds the declared deepspeed range of deepspeed-zero3-frozen-recompute (mechanism
zero3-frozen-recompute) against the rows (tests/versions/test_deepspeed_census.py).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from packaging.version import Version

from hotfix_lab.census import releases
from hotfix_lab.census import runner
from hotfix_lab.census.side import SideCensus
from hotfix_lab.infra import deepspeed_env
from hotfix_lab.infra import rank_results
from hotfix_lab.infra.paths import TOOLS

CENSUS = SideCensus("deepspeed", page="deepspeed", key=("release", "torch", "case", "hotfix"), tool="deepspeed census")
STORE, DOC, DIMENSION = CENSUS.store, CENSUS.doc, CENSUS.dimension
FIX, MECHANISM = "deepspeed-zero3-frozen-recompute", "zero3-frozen-recompute"
FIX_MODULE = "hotfix.patches.deepspeed_zero3_frozen_recompute"
#: the transformers release every case runs on (the tests' own, tests/e2e/test_deepspeed.py)
TRANSFORMERS = "4.56.2"
#: lines from here: first and last patch release; before it: the last release only
FIRST_LINE = (0, 12)
OLDEST_LINE = (0, 10)
#: tools/hotfix_lab/cases/deepspeed_cases.py's cases: ZeRO-2 and ZeRO-3, Whisper and the Llama decoder, LoRA and full,
#: reentrant and non-reentrant (the reference without checkpointing is inside every case), and per stage the
#: control: mode ``none``, the reference trained twice, no checkpointing anywhere (DeepSpeed alone: where it fails,
#: every case of that stage fails before any checkpoint runs, with hotfix as without)
CONTROLS = {2: "zero2:full:none", 3: "zero3:full:none"}
CASES = ("zero2:whisper:reentrant", "zero2:lora:nonreentrant", "zero2:full:reentrant",
         "zero3:lora:reentrant", "zero3:lora:nonreentrant", "zero3:full:nonreentrant",
         "zero3:whisper:reentrant", "zero3:whisper:nonreentrant",
         "zero3:whisper-lora:reentrant", "zero3:whisper-lora:nonreentrant", *CONTROLS.values())
#: the cases of the mechanism: ZeRO-3, frozen base parameters, non-reentrant checkpointing
FROZEN_CASES = ("zero3:lora:nonreentrant", "zero3:whisper-lora:nonreentrant")
#: torch's error where ZeRO-3 empties a frozen parameter between the forward and the recomputation
METADATA = "different metadata"
NO_RUN = "no-run"  # the verdict of a release that does not import or start on this torch (case "import")
NO_RUN_CASE = "import"
COLUMNS = {False: "upstream", True: "hotfix"}
#: ranks per launch.  Also the children's LOCAL_SIZE, as DeepSpeed's own launcher sets it: the CPU accelerator's
#: device count.  Without it, DeepSpeed before 0.16 runs ``numactl --hardware`` for that count inside ZeRO-3 and,
#: on a machine without numactl, fails every ZeRO-3 case (FileNotFoundError: 'numactl'; 0.14.5 and 0.15.0 under
#: torchrun, 2026-11-28); from 0.16 it counts 1 there.  ZeRO-3 reads it only to count nodes (1 either way).
RANKS = 2


# -- which releases ---------------------------------------------------------------------------------
def all_releases() -> List[str]:
    """Every final DeepSpeed release of the cache from OLDEST_LINE, oldest first."""
    found = [v for v in releases.uploads("deepspeed")
             if not (Version(v).is_prerelease or Version(v).is_devrelease) and Version(v).release[:2] >= OLDEST_LINE]
    return sorted(found, key=Version)


def lines() -> Dict[Tuple[int, int], List[str]]:
    """Minor line -> its final releases, oldest first."""
    out: Dict[Tuple[int, int], List[str]] = {}
    for v in all_releases():
        out.setdefault(Version(v).release[:2], []).append(v)
    return out


def base_releases() -> List[str]:
    """The census's releases before any bisection: the last of each line before FIRST_LINE, the first and the
    last of each line from it."""
    out = []
    for line, found in lines().items():
        out += [found[-1]] if line < FIRST_LINE else sorted({found[0], found[-1]}, key=Version)
    return out


def _signature(rows: Dict[tuple, Dict], release: str, torch: str) -> Optional[Dict[tuple, str]]:
    """A measured release's cells (case, hotfix) -> word; "does not run" as one cell; None where not measured."""
    mine = {(k[2], k[3]): word(r) for k, r in rows.items() if k[0] == release and k[1] == torch}
    if (NO_RUN_CASE, False) in mine:
        return {("*", False): "does not run"}
    return mine or None


def open_bisections(all_rows: List[Dict], torch: str) -> List[Tuple[str, str, List[str]]]:
    """Per line, each two neighbouring measured releases of this torch that disagree in a cell both have (upstream
    or with hotfix; "does not run" against running) with releases between them: (lower, upper, those between)."""
    rows = CENSUS.rows(all_rows, lambda r: r["torch"] == torch and r["verdict"] != "error")
    out = []
    for found in lines().values():
        measured = [v for v in found if _signature(rows, v, torch)]
        for low, high in zip(measured, measured[1:]):
            a, b = _signature(rows, low, torch), _signature(rows, high, torch)
            common = set(a) & set(b)
            differ = (set(a) != set(b) and (("*", False) in a or ("*", False) in b)) or any(a[c] != b[c] for c in common)
            between = found[found.index(low) + 1:found.index(high)]
            if differ and between:
                out.append((low, high, between))
    return out


# -- installing and running -------------------------------------------------------------------------
def install(version: str) -> Path:
    """DeepSpeed ``version`` in .matrix/deepspeed-<version> as scripts/test.sh installs it (sdist, no C++ op)."""
    return runner.install("deepspeed", version)


def _env(hotfix: bool, folder: Path, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    from hotfix.diagnostics.children import child_env

    paths = [folder, runner.MATRIX / f"transformers-{TRANSFORMERS}", TOOLS]
    return child_env(hotfix, keep_hotfix_settings=False, pythonpath=paths,
                     extra={**deepspeed_env.cpu_env(folder, runner.torch_release()), "LOCAL_SIZE": str(RANKS),
                            **(extra or {})})


def _last_line(text: str) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return _no_paths(kept[-1])[:300] if kept else ""


def _no_paths(text: str) -> str:
    """An error line without the file paths of this machine ("(/work/.../api.py)")."""
    return re.sub(r" \(/[^)]*\)", "", text)


PROBE = ("import deepspeed; from deepspeed.accelerator import get_accelerator; a = get_accelerator(); "
         "print(deepspeed.__version__, a.device_name(), a.communication_backend_name())")


def probe(folder: Path) -> str:
    """'' where ``import deepspeed`` and its CPU accelerator work with this torch, else the error's last line."""
    proc = subprocess.run([sys.executable, "-c", PROBE], env=_env(False, folder), cwd="/tmp", capture_output=True,
                          text=True, timeout=300)
    return "" if proc.returncode == 0 else _last_line(proc.stderr) or f"exit {proc.returncode}"


def launch(folder: Path, hotfix: bool, cases: List[str], timeout: float) -> Tuple[Dict[int, Dict], str]:
    """2 ranks of hotfix_lab.cases.deepspeed_cases over ``cases``: ({rank: its result file}, why there are not two)."""
    with tempfile.TemporaryDirectory() as out:
        command, loopback = rank_results.command(["-m", "hotfix_lab.cases.deepspeed_cases", out, *cases], RANKS)
        try:
            proc = subprocess.run(command, env={**loopback, **_env(hotfix, folder)}, cwd="/tmp", capture_output=True,
                                  text=True, timeout=timeout)
            why = f"exit {proc.returncode}: {_last_line(proc.stderr)[:200]}"
        except subprocess.TimeoutExpired:
            why = f"timed out after {timeout:.0f} s"
        found = rank_results.read(Path(out))
    return found, "" if sorted(found) == [0, 1] else why


def row_of(release: str, case: str, hotfix: bool, ranks: Dict[int, Dict], why: str) -> Dict:
    """One case over both ranks: equal (every gradient and parameter, both ranks), wrong, crash (a rank raised:
    rank 0's error first), error (no result: ``why``)."""
    found = [ranks[r]["cases"].get(case) for r in sorted(ranks)] if not why else []
    if why or any(f is None for f in found):
        verdict, detail = "error", why or "case missing from a rank file"
    elif any(not f.get("ok") for f in found):
        verdict, detail = "crash", next(f.get("error", "") for f in found if not f.get("ok"))
    elif all(f.get("equal") and f.get("params_equal") for f in found):
        verdict, detail = "equal", f"{found[0]['summary']}; parameters after two steps equal"
    else:
        bad = next(f for f in found if not (f.get("equal") and f.get("params_equal")))
        verdict, detail = "wrong", (bad["summary"] if not bad.get("equal") else
                                    "gradients equal; parameters: " + bad.get("params_summary", ""))
    return dict(dimension=DIMENSION, release=release, case=case, hotfix=hotfix, verdict=verdict, detail=str(detail)[:300])


def run_release(release: str, columns: Dict[bool, List[str]], sink, timeout: float) -> None:
    """The probe, then one launch per column (hotfix off, on: its cases) on ``release``; rows to ``sink``."""
    folder = install(release)
    failed = probe(folder)
    if failed:
        sink(dict(dimension=DIMENSION, release=release, case=NO_RUN_CASE, hotfix=False, verdict=NO_RUN, detail=failed))
        return
    for hotfix, cases in columns.items():
        started = time.monotonic()
        ranks, why = launch(folder, hotfix, cases, timeout)
        if not why:
            for rank, result in ranks.items():
                if result.get("hotfix_loaded") is not hotfix or result.get("deepspeed") != release:
                    why = (f"rank {rank}: hotfix_loaded {result.get('hotfix_loaded')}, "
                           f"deepspeed {result.get('deepspeed')} (expected {hotfix}, {release})")
        for case in cases:
            sink(row_of(release, case, hotfix, ranks, why))
        print(f"deepspeed census: {release} {COLUMNS[hotfix]}: {time.monotonic() - started:.0f} s", flush=True)


# -- the page ---------------------------------------------------------------------------------------
def word(row: Optional[Dict]) -> str:
    """A cell's verdict in a few words."""
    if row is None:
        return "not measured"
    if row["verdict"] == "equal":
        return "equal"
    if row["verdict"] == NO_RUN:
        return "does not run"
    if row["verdict"] == "wrong":
        return "wrong " + row["detail"].split(" parameter")[0]
    detail = row["detail"]
    for known, short in ((METADATA, "CheckpointError (metadata)"),
                         ("backward through the graph a second time", "backward twice"),
                         ("loss must be a scalar tensor", "no grad_fn"),
                         ("does not require grad", "no grad_fn"),
                         ("different number of tensors", "CheckpointError (count)"),
                         ("Output 0 of Split is a view", "in-place on a Split view")):
        if known in detail:
            return short
    return f"{row['verdict']}: {detail[:50]}"


def alone_fails(rows: Dict[tuple, Dict], release: str, torch: str, case: str, hotfix: bool) -> bool:
    """Whether ``case`` fails as its stage's control does (DeepSpeed without any checkpointing) in the same column:
    DeepSpeed's own failure, before any checkpoint runs."""
    row = rows.get((release, torch, case, hotfix))
    control = rows.get((release, torch, CONTROLS[int(case.split(":")[0].removeprefix("zero"))], hotfix))
    return (row is not None and control is not None and control["verdict"] not in ("equal", "error")
            and word(row) == word(control))


def holds(all_rows: List[Dict], torch: str) -> Dict[str, object]:
    """What holds under this torch, from the rows: the releases that do not run, those that run, the releases where
    upstream has the metadata error in a frozen case, (release, stage) where DeepSpeed fails without checkpointing
    (the control, upstream), and the cells with hotfix not equal other than those."""
    rows = CENSUS.rows(all_rows)
    measured = sorted({k[0] for k in rows if k[1] == torch}, key=Version)
    no_run = [v for v in measured if (v, torch, NO_RUN_CASE, False) in rows]
    running = [v for v in measured if v not in no_run]
    metadata = [v for v in running if any(METADATA in rows.get((v, torch, c, False), {}).get("detail", "")
                                          for c in FROZEN_CASES)]
    alone = [(v, stage, word(rows[(v, torch, control, False)])) for v in running for stage, control in CONTROLS.items()
             if rows.get((v, torch, control, False), {}).get("verdict", "equal") != "equal"]
    not_equal = [(v, c) for v in running for c in CASES
                 if rows.get((v, torch, c, True), {}).get("verdict") != "equal" and not alone_fails(rows, v, torch, c, True)]
    return dict(no_run=no_run, running=running, metadata=metadata, alone=alone, hotfix_not_equal=not_equal)


@CENSUS.page
def section(all_rows: List[Dict]) -> List[str]:
    rows = CENSUS.rows(all_rows)
    out = ["# DeepSpeed ZeRO-2 / ZeRO-3 with gradient checkpointing: every DeepSpeed line", "",
           "Rendered by tools/hotfix_lab/census/deepspeed_census.py from docs/census/deepspeed/ (2-vCPU VM, CPU, DeepSpeed CPU",
           f"accelerator, gloo; 2 ranks under torchrun; transformers {TRANSFORMERS}; tools/hotfix_lab/cases/deepspeed_cases.py:",
           "`deepspeed.initialize` with a client SGD optimizer, fp32, each rank on its half of one batch, two steps",
           "against the same two steps without checkpointing: every trainable gradient after the first backward",
           "(`safe_get_full_grad`) and every trainable parameter after the second, on both ranks). Each cell:",
           "upstream (HOTFIX_DISABLE=1) -> with hotfix. Cases: `zero<stage>:<model>:<checkpointing>`; `lora`: the",
           "tiny Llama decoder with PEFT LoRA (input hook), `full`: every parameter; `whisper`: the tiny Whisper, every",
           "parameter; `whisper-lora`: Whisper with LoRA without the input hook; `none`, the control: the same",
           "training twice without checkpointing (DeepSpeed alone). Each rank has `LOCAL_SIZE=2`, as",
           "DeepSpeed's own launcher sets it (without it and without numactl on the machine, DeepSpeed before 0.16",
           "fails every ZeRO-3 case under torchrun: FileNotFoundError 'numactl').",
           "",
           "\"CheckpointError (metadata)\": torch's non-reentrant checkpoint, \"Recomputed values for the following",
           "tensors have different metadata than during the forward pass\": ZeRO-3 has emptied a frozen (LoRA base)",
           f"parameter again before the recomputation ({FIX}, docs/fixes/{FIX}.md; DeepSpeed's own",
           "fix: deepspeedai/DeepSpeed#8148). \"backward twice\": \"Trying to backward through the graph a second",
           "time\" (Whisper's decoder under transformers 4.56's reentrant checkpointing: transformers' bug, not",
           "DeepSpeed's). \"no grad_fn\": the loss has none (reentrant checkpointing with no layer input needing grad):",
           "DeepSpeed's \"loss must be a scalar tensor\", or where its `backward` does not check, torch's \"element 0",
           "of tensors does not require grad\". \"does not run\": `import deepspeed` or its CPU accelerator fails with",
           "this torch (the error below); nothing else is measured there.",
           "",
           "Releases: the last of each line before 0.12, the first and the last patch release of each line from",
           "0.12, and where those two disagree in a cell, the releases between them by bisection.", ""]
    for torch in sorted({k[1] for k in rows}, key=Version):
        dates = sorted({r.get("date", "") for k, r in rows.items() if k[1] == torch})
        found = holds(all_rows, torch)
        out += [f"## torch {torch} (measured {', '.join(d for d in dates if d)})", ""]
        if found["no_run"]:
            out += ["Does not run with this torch:", ""]
            out += [f"- {v}: {_no_paths(rows[(v, torch, NO_RUN_CASE, False)]['detail'])}" for v in found["no_run"]]
            out.append("")
        out += ["| deepspeed | " + " | ".join(CASES) + " |", "|---|" + "---|" * len(CASES)]
        for release in found["running"]:
            cells = [f"{word(rows.get((release, torch, c, False)))} -> {word(rows.get((release, torch, c, True)))}"
                     for c in CASES]
            out.append(f"| {release} | " + " | ".join(cells) + " |")
        out.append("")
        if found["running"]:
            out += [f"- Runs from {found['running'][0]} (of the releases measured).",
                    f"- Upstream CheckpointError (metadata) in {' / '.join(FROZEN_CASES)}: "
                    + (", ".join(found["metadata"]) if found["metadata"] else "none") + ".",
                    *[f"- DeepSpeed {v} fails ZeRO-{stage} without checkpointing (the control): {what}; every "
                      f"ZeRO-{stage} case fails so, upstream and with hotfix." for v, stage, what in found["alone"]],
                    "- With hotfix: " + ("every other case of every running release equal." if not
                                         found["hotfix_not_equal"] else "not equal: " + ", ".join(
                                             f"{v} {c}" for v, c in found["hotfix_not_equal"]) + "."), ""]
    return out


render = CENSUS.render


# -- the gate ---------------------------------------------------------------------------------------
def gate_problems(all_rows: List[Dict], patch) -> List[str]:
    """Where the fix's declared deepspeed range and the rows disagree: upstream has the metadata error in a frozen
    case (ZeRO-3, LoRA, non-reentrant) exactly inside the range (each running release inside it in at least one of
    them, none outside it in any), and with hotfix every case of every running release is equal, except where
    DeepSpeed fails as the stage's control does, without checkpointing (``alone_fails``)."""
    from packaging.specifiers import SpecifierSet

    mechanism, problems = CENSUS.declared(patch, MECHANISM)
    if mechanism is None:
        return problems
    affected = SpecifierSet(mechanism.affected["deepspeed"])
    rows = CENSUS.rows(all_rows)
    out = []
    for torch in sorted({k[1] for k in rows}, key=Version):
        found = holds(all_rows, torch)
        for release in found["running"]:
            inside = affected.contains(release, prereleases=True)
            where = f"{release} (torch {torch})"
            shows = release in found["metadata"]
            if inside and not shows and not all(alone_fails(rows, release, torch, c, False) for c in FROZEN_CASES):
                out.append(f"{where} is inside the declared range but upstream has no metadata error")
            if shows and not inside:
                out.append(f"{where} has the metadata error upstream but is outside the declared range")
            for case in CASES:
                fixed = rows.get((release, torch, case, True))
                if (fixed is None or fixed["verdict"] != "equal") and not alone_fails(rows, release, torch, case, True):
                    out.append(f"{where} {case}: with hotfix {word(fixed)}")
    return out


@CENSUS.describes
def _describe(row: Dict) -> str:
    return f"[deepspeed {row['release']} {row['case']} hotfix {'on ' if row['hotfix'] else 'off'}] {word(row)}"


def _fix_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(FIX_MODULE) is not None
    except ModuleNotFoundError:
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--releases", default="", help="comma list: only these DeepSpeed releases (no bisection)")
    p.add_argument("--columns", choices=("both", "upstream", "hotfix"), default="both")
    p.add_argument("--remeasure", action="store_true", help="run the chosen releases again even where rows exist")
    p.add_argument("--refresh", action="store_true",
                   help="re-read PyPI's release lists first (releases.refresh: DeepSpeed's with the census's)")
    p.add_argument("--results", default=str(STORE), help="store directory, or a .jsonl file (tests)")
    p.add_argument("--doc", default=str(DOC))
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per launch")
    args = p.parse_args(argv)
    results = Path(args.results)
    if args.refresh:
        releases.refresh()
    if not args.render_only:
        columns = {"both": [False, True], "upstream": [False], "hotfix": [True]}[args.columns]
        if True in columns and not _fix_installed():
            raise SystemExit(f"{FIX_MODULE} is not installed in {sys.executable}: measure --columns upstream first")
        torch = runner.torch_release()
        sink = runner.RowSink(results, torch, _describe)
        only = [v for v in args.releases.split(",") if v]
        started = time.monotonic()

        def wanted(release: str, done_rows: List[Dict]) -> Dict[bool, List[str]]:
            """Column -> the cases it lacks for this release and torch."""
            if args.remeasure and only:
                return {c: list(CASES) for c in columns}
            mine = [r for r in done_rows if r["release"] == release and r["torch"] == torch and r["verdict"] != "error"]
            if any(r["verdict"] == NO_RUN for r in mine):
                return {}
            have = {(r["case"], r["hotfix"]) for r in mine}
            todo = {c: [case for case in CASES if (case, c) not in have] for c in columns}
            return {c: cases for c, cases in todo.items() if cases}

        # the base releases and every release already measured under this torch (a bisected one lacks a column)
        queue = only or sorted(set(base_releases()) | {r["release"] for r in runner.read_rows(results)
                                                      if r["torch"] == torch}, key=Version)
        done = set()
        while queue:
            for release in queue:
                done.add(release)
                todo = wanted(release, runner.read_rows(results))
                if todo:
                    try:
                        run_release(release, todo, sink, args.timeout)
                    except Exception as exc:  # one release failing to install must not stop the census
                        print(f"deepspeed census: {release}: {exc!r}", flush=True)
            if only:
                break
            # bisect: the middle release between each two neighbours that disagree
            queue = [between[len(between) // 2] for _, _, between in open_bisections(runner.read_rows(results), torch)]
            queue = [v for v in queue if v not in done or wanted(v, runner.read_rows(results))]
            # a release is only measured again when its columns are missing (a failed install is not retried here)
            queue = [v for v in queue if v not in done]
        CENSUS.compact(results)
        print(f"deepspeed census: measured in {time.monotonic() - started:.0f} s", flush=True)
    render(runner.read_rows(results), Path(args.doc))
    print(f"deepspeed census: {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
