#!/usr/bin/env python3
"""torch's checkpoint_wrapper around transformers layers: every transformers release the fix reaches, per torch line.

    python -P -m hotfix_lab.census.wrapper --jobs 2                       # install, measure, store, render
    .matrix/torch-2.11.0/bin/python -P -m hotfix_lab.census.wrapper --releases 4.56.2,5.23.0   # another torch
    python -P -m hotfix_lab.census.wrapper --render-only

For every transformers release of the census (hotfix_lab.census.releases) from 4.52.0 (``GradientCheckpointingLayer``,
what torch-checkpoint-wrapper hands the call to), one process runs hotfix_lab.cases.wrapper_cases without hotfix
(HOTFIX_DISABLE=1) and with it: a tiny Llama (``use_cache`` at its config's default), a tiny Whisper (full) and the
same Whisper with PEFT LoRA without the input hook, every ``GradientCheckpointingLayer`` wrapped by
``apply_activation_checkpointing`` with ``CheckpointImpl.REENTRANT`` and ``NO_REENTRANT``, in one process
(``plain``) and under FSDP2 with one gloo rank (``fsdp2``; torch >= 2.6, where ``fully_shard`` is public), every
trainable gradient against the same step without checkpointing.  About 15 s per release and half on the 2-core CPU
machine.

Rows: docs/census/wrapper/torch<version>.jsonl.gz (hotfix_lab.sweep.sweep_store).  The page: docs/census/wrapper.md.
``gate_problems()`` holds the declared range of torch-checkpoint-wrapper against the rows
(tests/versions/test_wrapper_census.py).
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional

from packaging.version import Version

from hotfix_lab.census import releases
from hotfix_lab.census import runner
from hotfix_lab.census.runner import install
from hotfix_lab.census.side import SideCensus, verdict_of

CENSUS = SideCensus("wrapper", page="wrapper", key=("release", "torch", "engine", "model", "impl", "hotfix"),
                    tool="wrapper")
STORE, DOC, DIMENSION = CENSUS.store, CENSUS.doc, CENSUS.dimension
FIX, MECHANISM = "torch-checkpoint-wrapper", "wrapper-cache"
FIRST = "4.52.0"  # GradientCheckpointingLayer
NOT_WRAPPED = "not wrapped: no GradientCheckpointingLayer"  # hotfix_lab.cases.wrapper_cases: nothing of the model wrapped
MODELS = ("llama", "whisper", "whisper-lora")
IMPLS = ("reentrant", "no_reentrant")
ENGINES = ("plain", "fsdp2")


def engines() -> List[str]:
    """The engines this torch runs on the CPU (FSDP2's ``fully_shard`` is public from 2.6)."""
    return [e for e in ENGINES if e != "fsdp2" or Version(runner.torch_release()) >= Version("2.6")]


def row_of(release: str, case: str, hotfix: bool, result: Optional[Dict], why: str = "") -> Dict:
    engine, model, impl = case.split(":")
    verdict, detail = verdict_of(result, why, lambda r: r.get("summary", ""))
    return dict(dimension=DIMENSION, release=release, engine=engine, model=model, impl=impl, hotfix=hotfix,
                verdict=verdict, detail=str(detail)[:300])


def run_release(release: str, hotfix: bool, sink, timeout: float) -> None:
    """hotfix_lab.cases.wrapper_cases on ``release``, every case, hotfix off or on (one gloo rank for FSDP2)."""
    from hotfix_lab.sweep import sweep_models

    install("transformers", release)
    cases = [f"{e}:{m}:{i}" for e in engines() for m in MODELS for i in IMPLS]
    found, why = runner.lab_rank("wrapper_cases", cases, hotfix, sweep_models.release_pythonpath(release), timeout)
    for case in cases:
        sink(row_of(release, case, hotfix, (found or {}).get("cases", {}).get(case), why))


# -- the page ---------------------------------------------------------------------------------------
def word(row: Optional[Dict]) -> str:
    """A cell's verdict in a few words: "equal", "wrong n/m", the error's first words."""
    if row is None:
        return "not measured"
    if row["verdict"] == "equal":
        return "equal"
    if row["verdict"] == "wrong":
        return "wrong " + row["detail"].split(" parameter")[0]
    detail = row["detail"]
    if NOT_WRAPPED in detail:
        return "n/a (no GradientCheckpointingLayer)"
    for known, short in (("different metadata", "CheckpointError (metadata)"),
                         ("different number of tensors", "CheckpointError (count)"),
                         ("does not require grad", "no grad_fn")):
        if known in detail:
            return short
    return f"{row['verdict']}: {detail[:50]}"


@CENSUS.page
def section(all_rows: List[Dict]) -> List[str]:
    rows = CENSUS.rows(all_rows)
    out = ["# torch's checkpoint_wrapper around transformers layers: every release torch-checkpoint-wrapper reaches", "",
           "Rendered by tools/hotfix_lab/census/wrapper.py from docs/census/wrapper/ (CPU; tools/hotfix_lab/cases/wrapper_cases.py: every",
           "`GradientCheckpointingLayer` wrapped by `apply_activation_checkpointing` with `checkpoint_wrapper`, `use_cache`",
           "at the config's default, one step against the same step without checkpointing, every trainable gradient).",
           "Each cell: upstream -> with hotfix. `plain`: one process; `fsdp2`: `fully_shard` on each wrapped layer and",
           "the model, one gloo rank. \"CheckpointError (metadata)\" / \"(count)\": torch's recomputation check;",
           "\"no grad_fn\": \"element 0 of tensors does not require grad\" (a layer with no input needing grad).",
           f"Below {FIRST} each model decides about its Cache in its own forward: not reached ({FIX}: NOT COVERED).", ""]
    for torch in sorted({k[1] for k in rows}, key=Version):
        dates = sorted({r.get("date", "") for k, r in rows.items() if k[1] == torch})
        present = [e for e in ENGINES if any(k[1] == torch and k[2] == e for k in rows)]
        columns = [(e, m, i) for e in present for m in MODELS for i in IMPLS]
        out += [f"## torch {torch} (measured {', '.join(d for d in dates if d)})", "",
                "| transformers | " + " | ".join(f"{e} {m} {i.replace('_', '-')}" for e, m, i in columns) + " |",
                "|---|" + "---|" * len(columns)]
        for release in sorted({k[0] for k in rows if k[1] == torch}, key=Version):
            cells = [f"{word(rows.get((release, torch, e, m, i, False)))} -> {word(rows.get((release, torch, e, m, i, True)))}"
                     for e, m, i in columns]
            out.append(f"| {release} | " + " | ".join(cells) + " |")
        out.append("")
    return out


render = CENSUS.render


# -- the gate ---------------------------------------------------------------------------------------
def gate_problems(all_rows: List[Dict], patch) -> List[str]:
    """Where the fix's declared range and the rows disagree: inside it upstream must be wrong or fail in some case of
    each release (the evidence for the range) and with hotfix every case equal; anywhere, with hotfix never worse
    than upstream."""
    from packaging.specifiers import SpecifierSet

    mechanism, problems = CENSUS.declared(patch, MECHANISM)
    if mechanism is None:
        return problems
    affected = SpecifierSet(mechanism.affected["transformers"])
    rows = CENSUS.rows(all_rows)
    out = []
    for key, row in sorted(rows.items()):
        release, torch, engine, model, impl, hotfix = key
        if hotfix:
            continue
        where = f"{release} (torch {torch}, {engine} {model} {impl})"
        if NOT_WRAPPED in row["detail"]:  # nothing to measure (4.52's Whisper): the page says n/a
            continue
        fixed = rows.get(key[:-1] + (True,))
        inside = affected.contains(release, prereleases=True)
        if inside and (fixed is None or fixed["verdict"] != "equal"):
            out.append(f"{where} is inside the range but with hotfix: {word(fixed)}")
        if row["verdict"] == "equal" and (fixed is None or fixed["verdict"] != "equal"):
            out.append(f"{where}: upstream equal, with hotfix {word(fixed)}")
    # the evidence for the range: per release, torch line and engine, some case of the Llama or the Whisper wrong or
    # failing upstream (from 5.14 the Llama trains equal upstream under NO_REENTRANT: each cell is not required to)
    shown: Dict[tuple, bool] = {}
    for (release, torch, engine, model, impl, hotfix), row in rows.items():
        if not hotfix and affected.contains(release, prereleases=True) and NOT_WRAPPED not in row["detail"]:
            shown[(release, torch, engine)] = shown.get((release, torch, engine), False) or row["verdict"] != "equal"
    out += [f"{release} (torch {torch}, {engine}) is inside the declared range but every case is equal upstream"
            for (release, torch, engine), seen in sorted(shown.items()) if not seen]
    return out


@CENSUS.describes
def _describe(row: Dict) -> str:
    return (f"[wrapper {row['release']} {row['engine']} {row['model']} {row['impl']} "
            f"hotfix {'on ' if row['hotfix'] else 'off'}] {word(row)}")


def main(argv=None) -> int:
    reached = [r for r in releases.transformers_releases() if Version(r) >= Version(FIRST)]
    return CENSUS.per_release_main(argv, __doc__.splitlines()[0], reached, run_release)


if __name__ == "__main__":
    sys.exit(main())
