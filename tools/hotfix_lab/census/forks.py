#!/usr/bin/env python3
"""The forks of unsloth's first offloaded checkpointer: every LlamaFactory and axolotl release, without and with hotfix.

    python -P -m hotfix_lab.census.forks --jobs 2                        # install, measure, store, render
    python -P -m hotfix_lab.census.forks --releases llamafactory==0.9.5,axolotl==0.19.0
    python -P -m hotfix_lab.census.forks --render-only

Every release of ``llamafactory`` and ``axolotl`` on PyPI (``RELEASES``, read 2026-11-25: 11 and 24; and axolotl
0.20.0 and 0.21.0, which ask Python >= 3.12, hidden from pip on 3.11: added 2026-11-30), each with a transformers
release its pins allow (the nearest one in .matrix/ where its exact pin is not there; the rows say which),
installed side by side into .matrix/ (``pip install --no-deps --target``; transformers with its dependencies:
tools/hotfix_lab/census/runner.py).  For every checkpoint function the release has
(``FUNCTIONS``; tools/hotfix_lab/infra/fork_loader.py turns it on as the fork does), one child runs
tools/hotfix_lab/cases/fork_cases.py's cases without hotfix (HOTFIX_DISABLE=1), then with hotfix activated in the
same process; a second child runs the plain case with hotfix on and the fork's own fix opted out
(HOTFIX_DISABLED_PATCHES): what hotfix's other fixes do to the fork's own wrapper (nothing, since they step aside
there: hotfix.relations).  ``--phases hotfix-without-fix --releases axolotl`` measures only that child again.  Each case
compares every parameter gradient with the same step without checkpointing (1e-6 relative).

Rows: docs/census/forks/torch<version>.jsonl.gz (tools/hotfix_lab/sweep/sweep_store.py; a folder of its own:
census.py reads every .jsonl.gz of docs/census/ as its own rows).  The page fragment:
docs/census/forks.md.  ``gate_problems()`` holds each fork fix's declared ranges against the rows
(tests/versions/test_llamafactory_unsloth_gc.py, test_axolotl_offload_checkpoint.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from packaging.version import Version

from hotfix_lab.census import runner
from hotfix_lab.census.cells import state
from hotfix_lab.census.runner import install
from hotfix_lab.census.side import SideCensus
from hotfix_lab.infra.paths import TOOLS

CENSUS = SideCensus("forks", page="forks", key=("fork", "release", "function", "case", "phase", "torch"), tool="forks")
STORE, DOC, DIMENSION = CENSUS.store, CENSUS.doc, CENSUS.dimension

#: fork -> (release, transformers release it runs with); None: the distribution holds no code (0.5.0's wheel and
#: sdist are empty).  Pre-4.52 forks run on 4.44.2 (the pre-GradientCheckpointingLayer call shape their pins use).
RELEASES: Dict[str, List[Tuple[str, Optional[str]]]] = {
    "llamafactory": [("0.7.1", "4.44.2"), ("0.8.0", "4.44.2"), ("0.8.1", "4.44.2"), ("0.8.2", "4.44.2"),
                     ("0.8.3", "4.44.2"), ("0.9.0", "4.44.2"), ("0.9.1", "4.44.2"), ("0.9.2", "4.44.2"),
                     ("0.9.3", "4.52.4"), ("0.9.4", "4.56.2"), ("0.9.5", "5.5.4")],
    "axolotl": [("0.5.0", None), ("0.5.2", "4.44.2"), ("0.6.0", "4.44.2"), ("0.7.0", "4.44.2"), ("0.8.0", "4.44.2"),
                ("0.8.1", "4.44.2"), ("0.9.0", "4.44.2"), ("0.9.1", "4.44.2"), ("0.9.1.post1", "4.44.2"),
                ("0.9.2", "4.44.2"), ("0.10.0", "4.52.4"), ("0.11.0", "4.53.3"), ("0.12.0", "4.56.2"),
                ("0.12.1", "4.56.2"), ("0.12.2", "4.56.2"), ("0.13.1", "4.57.6"), ("0.13.2", "4.57.6"),
                ("0.14.0", "5.0.0"), ("0.15.0", "5.5.4"), ("0.16.0", "5.5.4"), ("0.16.1", "5.5.4"),
                ("0.17.0", "5.16.1"), ("0.18.0", "5.16.1"), ("0.19.0", "5.16.1"),
                # ask Python >= 3.12 (matrix_install: installed for 3.11; their checkpointing files run on it)
                ("0.20.0", "5.17.0"), ("0.21.0", "5.20.1")],
}
#: fork -> its checkpoint functions (tools/hotfix_lab/infra/fork_loader.py FUNCTIONS)
FUNCTIONS = {"llamafactory": ("llamafactory-unsloth", "llamafactory-torch"),
             "axolotl": ("axolotl-offload", "axolotl-offload-disk")}
FIX = {"llamafactory": "llamafactory-unsloth-gc", "axolotl": "axolotl-offload-checkpoint"}
#: tools/hotfix_lab/cases/fork_cases.py case -> the page's column ("models": real models, several mechanisms at once)
COLUMN = {"plain": "wrapped-call", "tensor-output": "tensor-output", "several-outputs": "several-outputs",
          "output-with-none": "several-outputs", "keyword": "extra-inputs", "keyword-frozen-first": "extra-inputs",
          "whisper": "models", "gemma3n": "models", "gemma4": "models"}
CASES = tuple(COLUMN)
#: fork -> column -> the mechanism of its fix (the rows' "mechanism")
MECHANISMS = {
    # wrapped-call: LlamaFactory's wrapper reads func.__self__, which hotfix's wrappers of the call show
    # (hotfix/checkpointing/layer_call.py): no mechanism of its fix, the column stays as a check that it keeps working
    "llamafactory": {"extra-inputs": "unsloth-gc-extra-inputs", "several-outputs": "unsloth-gc-several-outputs",
                     "tensor-output": "unsloth-gc-tensor-output"},
    # axolotl's too since 2026-11-28: hotfix's transformers fixes leave axolotl's own wrapper alone where its fix is
    # not applied (hotfix.relations), so the column shows hotfix without it running as upstream
    "axolotl": {"extra-inputs": "offload-extra-inputs", "several-outputs": "offload-several-outputs",
                "tensor-output": "offload-tensor-output"},
}
#: column -> (phase whose verdict a mechanism's range declares, the functions whose cells count): torch's own
#: checkpoint behind LlamaFactory's wrapper has transformers' keyword bug (transformers-checkpoint-layer-io)
GATE_CELLS = {
    "extra-inputs": ("upstream", ("llamafactory-unsloth", "axolotl-offload", "axolotl-offload-disk")),
    "several-outputs": ("upstream", ("llamafactory-unsloth", "axolotl-offload", "axolotl-offload-disk")),
    "tensor-output": ("upstream", ("llamafactory-unsloth", "axolotl-offload", "axolotl-offload-disk")),
}
PHASES = ("upstream", "hotfix", "hotfix-without-fix")


def _row(fork, release, transformers, function, case, phase, result) -> Dict:
    status = result.get("status", "error")
    detail = result.get("summary") or result.get("error") or ""
    return dict(dimension=DIMENSION, fork=fork, release=release, transformers=transformers, function=function,
                case=case, mechanism=MECHANISMS[fork].get(COLUMN[case], COLUMN[case]), phase=phase,
                hotfix=phase != "upstream",
                verdict={"differs": "wrong"}.get(status, status), detail=str(detail)[:160])


def run_release(fork: str, release: str, transformers: Optional[str], sink, timeout: float,
                phases: Tuple[str, ...] = PHASES) -> None:
    """Every function of one release: upstream then hotfix in one child; hotfix without the fork's fix in another
    (``phases``: the children of those phases only)."""
    from hotfix.diagnostics.children import child_env, json_lines, last_line, run_python

    if transformers is None:
        for function in FUNCTIONS[fork]:
            for case in CASES:
                for phase in PHASES:
                    sink(_row(fork, release, "-", function, case, phase,
                              dict(status="n/a", error="absent: the distribution holds no code")))
        return
    paths = [install(fork, release), install("transformers", transformers), TOOLS]
    for function in FUNCTIONS[fork]:
        children = [
            (("upstream", "hotfix"), [*CASES, "--activate", *CASES], {"HOTFIX_DISABLE": "1"}),
            (("hotfix-without-fix",), ["plain"], {"HOTFIX_DISABLED_PATCHES": FIX[fork]}),
        ]
        children = [child for child in children if set(child[0]) & set(phases)]
        for child_phases, args, extra in children:  # not ``phases``: the next function filters its children by it
            env = child_env(True, keep_hotfix_settings=False, pythonpath=paths, extra=dict(extra, OMP_NUM_THREADS="1"))
            try:
                proc = run_python(["-P", "-m", "hotfix_lab.cases.fork_cases", function, *args], env=env,
                                  cwd=Path("/tmp"), timeout=timeout)
                found = {}
                phase_of = {"hotfix": child_phases[0]} if child_phases == ("hotfix-without-fix",) else {}
                for r in json_lines(proc.stdout):
                    found[(phase_of.get(r.get("phase"), r.get("phase")), r.get("case"))] = r
                missing = f"child exit {proc.returncode}: {last_line(proc)[:200]}"
            except subprocess.TimeoutExpired:
                found, missing = {}, f"child ran past {timeout:.0f} s"
            for phase in child_phases:
                for case in (CASES if phase != "hotfix-without-fix" else ("plain",)):
                    result = found.get((phase, case)) or dict(status="error", error=missing)
                    sink(_row(fork, release, transformers, function, case, phase, result))


def _broken(verdict: str) -> bool:
    return verdict not in ("equal", "n/a")


def _cell(rows: List[Dict], phase: str) -> str:
    """The census's word for a phase's rows (``cells.state``); no row is "not measured", never "n/a" (which says
    the release has no such function)."""
    word = state(r["verdict"] for r in rows if r["phase"] == phase)
    return "not measured" if word == "–" else word


def gate_problems(rows: List[Dict]) -> List[str]:
    """Where a fork fix's declared range and the rows disagree: a measured release broken outside the range, or
    one inside it that no cell shows broken (both by the phase ``GATE_CELLS`` names), and any row with hotfix that
    is not equal (or n/a)."""
    from importlib import import_module

    from hotfix.versions import version_in_range

    problems = []
    for fork, fix in FIX.items():
        patch = import_module("hotfix.patches." + fix.replace("-", "_")).patch
        columns = {name: column for column, name in MECHANISMS[fork].items()}
        for mechanism in patch.mechanisms:
            phase, functions = GATE_CELLS[columns[mechanism.name]]
            spec = mechanism.affected[fork]
            cells = [r for r in rows if r["fork"] == fork and r["phase"] == phase and r["function"] in functions
                     and r["mechanism"] == mechanism.name and r["verdict"] != "n/a"]
            for release in sorted({r["release"] for r in cells}, key=Version):
                verdicts = [r["verdict"] for r in cells if r["release"] == release]
                if "error" in verdicts:
                    problems.append(f"{fork} {release} {mechanism.name}: a cell could not be measured")
                    continue
                broken, inside = any(_broken(v) for v in verdicts), version_in_range(release, spec)
                if broken != inside:
                    problems.append(f"{fork} {release} {mechanism.name}: {'broken' if broken else 'fine'} "
                                    f"{phase}, {'inside' if inside else 'outside'} the declared range {spec}")
    for r in rows:
        if r["phase"] == "hotfix" and r["verdict"] not in ("equal", "n/a"):
            problems.append(f"{r['fork']} {r['release']} {r['function']} {r['case']}: {r['verdict']} with hotfix: "
                            f"{r['detail']}")
    return problems


@CENSUS.page
def section(rows: List[Dict]) -> List[str]:
    dates = sorted({r["date"] for r in rows}) or ["-"]
    torches = sorted({r["torch"] for r in rows}, key=Version)
    out = ["# The forks of unsloth's offloaded checkpointer: LlamaFactory and axolotl, every release", "",
           f"Generated by `python -P -m hotfix_lab.census.forks` (see its docstring) from the rows in `docs/census/forks/`; "
           f"measured {dates[0]} to {dates[-1]}, CPU only, torch {', '.join(torches)}, Python 3.11 (axolotl 0.20.0 "
           "and later ask Python >= 3.12: their checkpointing files, loaded alone, run on 3.11).", "",
           "Each cell: upstream (hotfix off) → with hotfix, over the cases of that column (tools/hotfix_lab/cases/fork_cases.py; "
           "every parameter gradient against the same step without checkpointing, 1e-6): *broken* a case crashed or a "
           "gradient was missing or wrong, *fine* every case equal, *n/a* the release has no such function, *not "
           "measured* no row. "
           "*with hotfix, fork fix off*: the plain case (only hidden_states, what the fork was written for) with "
           "hotfix's other fixes on and the fork's own fix opted out. Since 2026-11-28 hotfix's transformers fixes "
           "step aside for a fork's own wrapper where the fork's fix is not applied (docs/design.md, reliances): "
           "upstream's run; before, axolotl's crashed there on every release (its wrapper read `.func` from "
           "hotfix's wrapper of the call: AttributeError). "
           "Columns: extra-inputs = a context tensor needing grad into every layer (by keyword from transformers "
           "4.52, positionally before), also behind a frozen first input; several-outputs = a layer returning "
           "(hidden, aux) or (hidden, None); tensor-output = a layer returning a tensor; models = tiny Whisper, "
           "Gemma-3n text (4.53+), Gemma-4 with KV sharing (5.5+).", "",
           "llamafactory-torch is LlamaFactory's default (torch's reentrant checkpoint behind its wrapper): what is "
           "broken there upstream is transformers' own keyword-tensors and shared-mapping defects (Whisper, the "
           "context tensor, Gemma-4; `transformers-checkpoint-layer-io`), counted in docs/versions.md, not here. "
           "Each release runs with a transformers release its pins allow, or the nearest one measured (column "
           "*transformers*; releases pinned to 4.46 - 4.51 run on 4.44.2, the same call shape).", ""]
    columns = ("extra-inputs", "several-outputs", "tensor-output", "models")
    for fork in FIX:
        out += [f"## {fork} (fix `{FIX[fork]}`)", ""]
        for torch in torches:
            mine = [r for r in rows if r["fork"] == fork and r["torch"] == torch]
            releases = sorted({r["release"] for r in mine}, key=Version)
            out += [f"torch {torch}, {len(releases)} releases.", "",
                    "| release | transformers | function | " + " | ".join(columns)
                    + " | with hotfix, fork fix off |", "|---" * (len(columns) + 4) + "|"]
            for release in releases:
                for function in FUNCTIONS[fork]:
                    cells = [r for r in mine if r["release"] == release and r["function"] == function]
                    if not cells:
                        continue
                    if all(r["verdict"] == "n/a" for r in cells):
                        why = next((r["detail"] for r in cells), "")
                        out.append(f"| {release} | {cells[0]['transformers']} | {function} | "
                                   + " | ".join("n/a" for _ in columns) + f" | n/a ({why}) |")
                        continue
                    parts = []
                    for column in columns:
                        col = [r for r in cells if COLUMN[r["case"]] == column]
                        before, after = _cell(col, "upstream"), _cell(col, "hotfix")
                        parts.append(before if before == after == "n/a" else f"{before} → {after}"
                                     if after != "fine" else f"{before} → equal")
                    plain = _cell([r for r in cells if r["case"] == "plain"], "hotfix-without-fix")
                    out.append(f"| {release} | {cells[0]['transformers']} | {function} | " + " | ".join(parts)
                               + f" | {'BROKEN' if plain == 'broken' else plain} |")
            out.append("")
    problems = gate_problems(rows)
    out += ["## Declared ranges against these rows", ""]
    for fork, fix in FIX.items():
        from importlib import import_module

        patch = import_module("hotfix.patches." + fix.replace("-", "_")).patch
        for mechanism in patch.mechanisms:
            out.append(f"- `{fix}` {mechanism.name}: {fork} {mechanism.affected[fork]}"
                       + (f" (fixed in {mechanism.fixed_in})" if mechanism.fixed_in else "") + f": {mechanism.summary}")
    out += ["", "Disagreements: " + ("none." if not problems else ""), *[f"- {p}" for p in problems], ""]
    details = [r for r in rows if r["phase"] == "upstream" and _broken(r["verdict"]) and r["verdict"] != "error"]
    out += ["## What upstream does (first release of each distinct error)", ""]
    seen = set()
    for r in sorted(details, key=lambda r: (r["fork"], r["function"], r["case"], Version(r["release"]))):
        key = (r["fork"], r["function"], r["case"], r["detail"])
        if key not in seen:
            seen.add(key)
            out.append(f"- {r['fork']} {r['release']} {r['function']} {r['case']}: {r['verdict']}: {r['detail']}")
    return out


render = CENSUS.render


@CENSUS.describes
def _describe(row: Dict) -> str:
    return (f"[{row['fork']} {row['release']} {row['function']} {row['phase']}] {row['case']}: "
            f"{row['verdict']} {row['detail'][:80]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--releases", default="", help="comma list of fork==version, or a fork's name for all its releases "
                   "(default: every one of RELEASES)")
    p.add_argument("--phases", default=",".join(PHASES),
                   help=f"comma list of {', '.join(PHASES)}: measure (again) only those children; a release with "
                        "rows of those phases is measured again only when --releases names it")
    runner.add_store_arguments(p, STORE, DOC, 900.0, "seconds per child")
    args = p.parse_args(argv)
    only = set(filter(None, args.releases.split(",")))
    phases = tuple(phase for phase in PHASES if phase in args.phases.split(","))

    def jobs(torch: str, rows: List[Dict], sink) -> List:
        done = {(r["fork"], r["release"]) for r in rows if r["torch"] == torch and r["verdict"] != "error"
                and r["phase"] in phases}
        return [lambda entry=(fork, release, transformers): run_release(*entry, sink, args.timeout, phases)
                for fork, entries in RELEASES.items() for release, transformers in entries
                if (f"{fork}=={release}" in only or fork in only) or (not only and (fork, release) not in done)]

    return CENSUS.measure_and_render(args, jobs)


if __name__ == "__main__":
    sys.exit(main())
