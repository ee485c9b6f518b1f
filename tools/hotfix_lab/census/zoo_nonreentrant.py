#!/usr/bin/env python3
"""Does unsloth's offloading checkpoint run under non-reentrant checkpointing?  Every unsloth-zoo release.

    python -P -m hotfix_lab.census.zoo_nonreentrant --jobs 2            # install, measure, store, render
    python -P -m hotfix_lab.census.zoo_nonreentrant --releases 2025.11.5,2026.10.9
    python -P -m hotfix_lab.census.zoo_nonreentrant --render-only

For every unsloth-zoo release of the census (tools/hotfix_lab/census/releases.py) under transformers 5.23.0 and
4.56.2 (the lines after and before 5.0.0 made ``use_reentrant=False`` the default), one process forked
per release (tools/hotfix_lab/cases/zoo_routing.py --serve: imports shared, ``--chunk`` releases each) runs without
hotfix (HOTFIX_DISABLE=1), then with hotfix activated in the same process (as the census's zoo
dimension does): a tiny Llama trained three steps with checkpointing enabled as transformers does by default and as TRL does
(``gradient_checkpointing_kwargs={"use_reentrant": False}``), after unsloth's own
``patch_unsloth_smart_gradient_checkpointing()`` (what ``use_gradient_checkpointing="unsloth"`` calls),
and once with TRL's kwargs before it (a user who never asked for unsloth's offload).  A cell *runs*
when every checkpointed layer of every step went through ``UnslothCheckpointFunction``; *bypassed*
when none did.  It also says whether step 1 offloaded (unsloth's "Will smartly offload" line) and
whether every gradient equals the same step without checkpointing.

Rows: docs/census/zoo-nonreentrant/torch<version>.jsonl.gz (tools/hotfix_lab/sweep/sweep_store.py; a folder of its
own: census.py reads every .jsonl.gz of docs/census/ as its own rows).  The page fragment:
docs/census/zoo-nonreentrant.md (``section()`` gives the same lines to a caller).  ``gate_problems()``
holds the declared ranges of unsloth-zoo-nonreentrant-offload against the rows
(tests/versions/test_unsloth_zoo_nonreentrant_offload.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from packaging.version import Version

from hotfix_lab.census import releases
from hotfix_lab.census import runner
from hotfix_lab.census.runner import install
from hotfix_lab.census.side import SideCensus
from hotfix_lab.infra.paths import TOOLS

CENSUS = SideCensus("unsloth-zoo-nonreentrant", page="zoo-nonreentrant",
                    key=("release", "transformers", "torch", "setup", "requested", "hotfix"), tool="zoo_nonreentrant")
STORE, DOC, DIMENSION = CENSUS.store, CENSUS.doc, CENSUS.dimension
TRANSFORMERS = ("5.23.0", "4.56.2")
#: the child's setups, upstream then with hotfix activated in the same process (as the census's zoo dimension
#: does): a user who did not ask for unsloth's offload, unsloth's request, then as a trainer enables checkpointing
HALF = ("trl", "swap", "default", "trl")
SETUPS = (*HALF, "unswap", "activate", *HALF)
FIX = "unsloth-zoo-nonreentrant-offload"
#: (mechanism of FIX, transformers release, setup): the cells whose upstream verdict that mechanism's range declares
MECHANISM_CELLS = {
    "non-reentrant-default": [("5.23.0", "default")],
    "non-reentrant-requested": [("5.23.0", "trl"), ("4.56.2", "trl")],
}


def row_of(result: Dict, zoo: str, transformers: str, hotfix: bool, release_offloads: Optional[bool]) -> Dict:
    """One setup's result (zoo_routing.py) as a row: runs / bypassed / partial / crash, step 1's offload, gradients."""
    steps = result.get("steps") or []
    nodes = [step["unsloth_nodes"] for step in steps]
    layers = result.get("layers")
    if result.get("status") == "crash" or not steps:
        verdict = "crash" if result.get("status") == "crash" else "error"
    elif all(n == layers for n in nodes):
        verdict = "runs"
    elif not any(nodes):
        verdict = "bypassed"
    else:
        verdict = "partial"
    grads = "equal" if steps and all(step["grads"] == "equal" for step in steps) else "differs"
    differing = next((step["summary"] for step in steps if step["grads"] != "equal"), "")
    return dict(dimension=DIMENSION, release=zoo, transformers=transformers, setup=result["setup"],
                requested=result["requested"], hotfix=hotfix, verdict=verdict, nodes=nodes,
                offload_step1=bool(steps and steps[0]["offload_line"]),
                offloaded=any(step["offload_line"] for step in steps), release_offloads=release_offloads,
                grads=grads if steps else "none",
                repaired=result.get("repaired", []), detail=result.get("error") or differing)


def run_chunk(zoos: List[str], transformers: str, sink, timeout: float) -> None:
    """One hotfix_lab.cases.zoo_routing --serve process for ``zoos`` under ``transformers`` (a fork per release)."""
    from hotfix.diagnostics.children import child_env, json_lines, last_line, run_python

    folders = {str(install("unsloth-zoo", zoo)): zoo for zoo in zoos}
    paths = [install("transformers", transformers), TOOLS]
    env = child_env(False, keep_hotfix_settings=False, pythonpath=paths, extra={"OMP_NUM_THREADS": "1"})
    proc = run_python(["-P", "-m", "hotfix_lab.cases.zoo_routing", "--serve", ",".join(folders), *SETUPS],
                      env=env, cwd=Path("/tmp"), timeout=timeout * len(zoos))
    lines = json_lines(proc.stdout)
    expected = 2 * sum(setup in ("trl", "default") for setup in HALF)
    for folder, zoo in folders.items():
        mine = [r for r in lines if r.get("zoo_dir") == folder]
        header = next((r for r in mine if r.get("case") == "header"), {})
        found = [r for r in mine if r.get("case") == "setup"]
        if len(found) != expected:
            why = next((r["error"] for r in mine if r.get("case") == "error"), f"exit {proc.returncode}")
            sink(dict(dimension=DIMENSION, release=zoo, transformers=transformers, setup="*", requested=None,
                      hotfix=None, verdict="error", detail=f"{why}: {last_line(proc)[:200]}"))
            continue
        for result in found:
            sink(row_of(result, zoo, transformers, result["hotfix"], header.get("release_offloads")))


# -- the page ---------------------------------------------------------------------------------------
def offloading_releases(all_rows: List[Dict]) -> Dict[Tuple[str, str], bool]:
    """(release, torch) -> does the release's own function offload at all (measured upstream)."""
    return {(r["release"], r["torch"]): r["release_offloads"] for r in all_rows
            if r.get("dimension") == DIMENSION and r.get("release_offloads") is not None}


def lost_offload(row: Optional[Dict], offloads: Optional[bool]) -> bool:
    """Upstream broken: unsloth's function was bypassed in a release whose function offloads."""
    return row is not None and row["verdict"] == "bypassed" and bool(offloads)


def _word(row: Optional[Dict], offloads: Optional[bool]) -> str:
    if row is None:
        return "–"
    if row["verdict"] in ("crash", "error", "partial"):
        return row["verdict"]
    text = row["verdict"]
    if offloads is False:
        text += " (the release never offloads)"
    elif row["verdict"] == "runs":
        text += (", offload in step 1" if row["offload_step1"] else
                 ", offload from step 2" if row.get("offloaded") else ", no offload")
    if row["grads"] != "equal":
        text += ", **gradients differ**"
    return text


def _cell(rows: Dict[tuple, Dict], offloads: Dict, zoo: str, torch: str, transformers: str, setup: str,
          requested: bool) -> str:
    upstream = rows.get((zoo, transformers, torch, setup, requested, False))
    fixed = rows.get((zoo, transformers, torch, setup, requested, True))
    if upstream is None and fixed is None:
        return "not measured"
    known = offloads.get((zoo, torch))
    if not requested:  # a user who never asked for unsloth's offload: non-reentrant is right
        up, hf = (("non-reentrant" if row["verdict"] == "bypassed" else f"**{_word(row, known)}**")
                  if row is not None else "–" for row in (upstream, fixed))
        return up if up == hf else f"{up} → {hf}"
    up, hf = _word(upstream, known), _word(fixed, known)
    if fixed is not None and FIX in fixed.get("repaired", []):
        hf += ", repaired line"
    if lost_offload(upstream, known):
        up = f"**{up}**"
    return up if up == hf else f"{up} → {hf}"


def _spans(releases_in_order: List[str], chosen: set) -> str:
    """'a – b, c' for the releases of ``chosen``, in runs of consecutive releases."""
    runs, current = [], []
    for release in releases_in_order:
        if release in chosen:
            current.append(release)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]} – {r[-1]}" for r in runs) or "none"


#: the page's columns: (transformers, setup, unsloth's offload asked for)
COLUMNS = (("5.23.0", "default", True), ("5.23.0", "trl", True), ("4.56.2", "default", True),
           ("4.56.2", "trl", True), ("5.23.0", "trl", False))
#: the columns whose call is non-reentrant (4.56.2's default is reentrant)
NON_REENTRANT = [cell for cells_of in MECHANISM_CELLS.values() for cell in cells_of]


@CENSUS.page
def section(all_rows: List[Dict]) -> List[str]:
    """The markdown lines of the page fragment (a caller such as tools/hotfix_lab/census/render.py may embed them)."""
    rows = CENSUS.rows(all_rows, lambda r: r["setup"] != "*")
    offloads = offloading_releases(all_rows)
    pairs = {(k[0], k[1], k[2]) for k in rows}
    errors = [r for r in all_rows if r.get("dimension") == DIMENSION and r["verdict"] == "error"
              and (r["release"], r["transformers"], r["torch"]) not in pairs]
    order = [zoo for zoo, _ in releases.zoo_releases()]
    out = ["## unsloth's offload under non-reentrant checkpointing", "",
           "Generated by `python -P -m hotfix_lab.census.zoo_nonreentrant` (see its docstring) from the rows in "
           "`docs/census/zoo-nonreentrant/`. Each cell: without hotfix → with hotfix, for a tiny Llama trained "
           "three steps after unsloth-zoo's own `patch_unsloth_smart_gradient_checkpointing()` (what "
           "`use_gradient_checkpointing=\"unsloth\"` calls), checkpointing then enabled by transformers' "
           "`gradient_checkpointing_enable()` as a trainer does. *runs*: every checkpointed layer of every step "
           "went through unsloth's `UnslothCheckpointFunction`; *bypassed*: none did (torch's own checkpoint "
           "ran instead); **bold**: bypassed where the release's function offloads, so the offload is lost; "
           "*offload in step 1*: unsloth's \"Will smartly offload\" line in the first step (from step 2: the "
           "release's late offload, which unsloth-zoo-offload-backward repairs where it applies). Every cell's "
           "gradients equal the same step without checkpointing unless it says otherwise. *default*: "
           "`gradient_checkpointing_enable()` (5.x: non-reentrant; 4.x: reentrant); *TRL*: "
           "`gradient_checkpointing_kwargs={\"use_reentrant\": False}`; *not asked*: TRL's kwargs without "
           "unsloth's request (stays non-reentrant with hotfix: no unsloth, no repaired line).", ""]
    dates = sorted({r["date"] for r in rows.values()})
    if dates:
        out += [f"Measured {dates[0]} to {dates[-1]}, CPU only (tools/hotfix_lab/cases/zoo_routing.py).", ""]
    for torch in sorted({r["torch"] for r in rows.values()}, key=Version):
        measured = [z for z in order if any(k[0] == z and k[2] == torch for k in rows)]
        out += [f"### torch {torch} ({len(measured)} of {len(order)} releases measured)", "",
                "| release | 5.23.0 default | 5.23.0 TRL | 4.56.2 default | 4.56.2 TRL | 5.23.0 TRL, not asked |",
                "|---|---|---|---|---|---|"]
        for zoo in measured:
            out.append(f"| {zoo} | " + " | ".join(_cell(rows, offloads, zoo, torch, *column) for column in COLUMNS)
                       + " |")
        out.append("")
        lost = {z for z in measured for t, s in NON_REENTRANT
                if lost_offload(rows.get((z, t, torch, s, True, False)), offloads.get((z, torch)))}
        out += [f"Offload lost upstream under a non-reentrant call (torch {torch}): {_spans(order, lost)}.", ""]
    if errors:
        out += ["Not measured (run again): " + "; ".join(
            f"{r['release']} with transformers {r['transformers']}: {r['detail']}"
            for r in errors), ""]
    return out


render = CENSUS.render


# -- the gate ---------------------------------------------------------------------------------------
def gate_problems(all_rows: List[Dict], patch) -> List[str]:
    """Where ``patch``'s declared unsloth-zoo ranges and the measured upstream verdicts disagree.

    Per mechanism (``MECHANISM_CELLS``): a release whose cell loses the offload upstream (bypassed, and
    the release's function offloads) must be inside the range or in ``unreached``; one that runs upstream,
    or whose function never offloads, must be outside it; inside the range, the same cell with hotfix must
    run with equal gradients and the fix's repaired line.
    """
    from packaging.specifiers import SpecifierSet

    def holds(spec: Optional[str], release: str) -> bool:
        return spec is not None and SpecifierSet(spec).contains(release, prereleases=True)

    declared = {m.name: m for m in patch.mechanisms}
    rows = CENSUS.rows(all_rows, lambda r: r["setup"] != "*")
    offloads = offloading_releases(all_rows)
    out = []
    for name, cells_of in MECHANISM_CELLS.items():
        mechanism = declared.get(name)
        if mechanism is None:
            out.append(f"{name}: not declared by {patch.name}")
            continue
        for (zoo, transformers, torch, setup, requested, hotfix), row in sorted(rows.items()):
            if hotfix or not requested or (transformers, setup) not in cells_of:
                continue
            inside = holds(mechanism.affected.get("unsloth-zoo"), zoo)
            unreached = holds(mechanism.unreached.get("unsloth-zoo"), zoo)
            broken = lost_offload(row, offloads.get((zoo, torch)))
            where = f"{name}: unsloth-zoo {zoo} (transformers {transformers} {setup}, torch {torch})"
            if broken and not (inside or unreached):
                out.append(f"{where} loses unsloth's offload upstream but is outside the declared range")
            if inside and not broken:
                out.append(f"{where} is inside the declared range but upstream: {_word(row, offloads.get((zoo, torch)))}")
            fixed = rows.get((zoo, transformers, torch, setup, requested, True))
            plain = rows.get((zoo, transformers, torch, "trl", False, True))  # TRL's call, not asked
            if plain is None or plain["verdict"] != "bypassed" or FIX in plain.get("repaired", []):
                out.append(f"{where}: not asked, with hotfix: {_word(plain, None)}, repaired "
                           f"{(plain or {}).get('repaired')} (must stay non-reentrant)")
            if inside and (fixed is None or fixed["verdict"] != "runs" or fixed["grads"] != "equal"
                           or FIX not in fixed.get("repaired", [])):
                out.append(f"{where} is inside the range but with hotfix: {_word(fixed, None)}, repaired "
                           f"{(fixed or {}).get('repaired')}")
    return out


@CENSUS.describes
def _describe(row: Dict) -> str:
    return (f"[{row['release']} {row['transformers']} hotfix {'on ' if row['hotfix'] else 'off'}] "
            f"{row['setup']:<9} asked={row['requested']!s:<5} "
            f"{_word(row, row.get('release_offloads')) if row['setup'] != '*' else row['detail']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--releases", default="", help="comma list: only these unsloth-zoo releases")
    p.add_argument("--transformers", default=",".join(TRANSFORMERS))
    p.add_argument("--chunk", type=int, default=8, help="releases per process (forked after its imports)")
    runner.add_store_arguments(p, STORE, DOC, 600.0, "seconds per release")
    args = p.parse_args(argv)
    only = set(filter(None, args.releases.split(",")))

    def jobs(torch: str, rows: List[Dict], sink) -> List:
        done = {(r["release"], r["transformers"]) for r in rows if r["torch"] == torch and r["verdict"] != "error"}
        chunks: List[Tuple[List[str], str]] = []
        for transformers in args.transformers.split(","):
            todo = [zoo for zoo, _ in releases.zoo_releases()
                    if (not only or zoo in only) and (zoo, transformers) not in done]
            chunks += [(todo[i:i + args.chunk], transformers) for i in range(0, len(todo), args.chunk)]
        return [lambda chunk=chunk: run_chunk(*chunk, sink, args.timeout) for chunk in chunks]

    return CENSUS.measure_and_render(args, jobs)


if __name__ == "__main__":
    sys.exit(main())
