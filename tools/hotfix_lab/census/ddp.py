#!/usr/bin/env python3
"""DDP with ``find_unused_parameters=True`` around reentrant checkpointing: every transformers release of the census.

    python -P -m hotfix_lab.census.ddp --jobs 2                       # install, measure, store, render
    .matrix/torch-2.14.1/bin/python -P -m hotfix_lab.census.ddp --releases 4.56.2,5.23.0   # another torch
    python -P -m hotfix_lab.census.ddp --render-only

For every transformers release of the census (tools/hotfix_lab/census/releases.py), one DDP rank (gloo, loopback;
DDP's unused-parameter search and its "ready" marks are local to a rank, so one rank shows the defect as
two do: docs/fixes/transformers-ddp-find-unused.md) runs tools/hotfix_lab/cases/ddp_cases.py without hotfix
(HOTFIX_DISABLE=1) and with it: a tiny Llama with PEFT LoRA on q_proj/v_proj and with every parameter
training, through torch's reentrant checkpoint and unsloth-zoo's ``UnslothCheckpointFunction`` (the
release tools/hotfix_lab/sweep/sweep_models.py names, loaded on CPU), every trainable parameter's gradient after
DDP's all-reduce against DDP without checkpointing; and the direct call (torch-ddp-find-unused): a
``PreTrainedModel`` as Hub modeling files write it (hotfix_lab.infra.remote_code_model), whose own forward calls
the ``checkpoint`` its module imported, through torch's class and after unsloth's swap of its class in for
torch's.  Below transformers 4.43 the LoRA cases run the older PEFT the sweep uses there.  About 10 s per
release and half on the 2-core CPU machine.

Rows: docs/census/ddp/torch<version>.jsonl.gz (tools/hotfix_lab/sweep/sweep_store.py; a folder of its own).  The
page: docs/census/ddp.md.  ``gate_problems()`` holds the declared range of transformers-ddp-find-unused
(mechanism ddp-hidden-parameters) and torch-ddp-find-unused's (the direct cases) against the rows
(tests/versions/test_ddp_census.py).
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional

from packaging.version import Version

from hotfix_lab.census import releases
from hotfix_lab.census import runner
from hotfix_lab.census.runner import install
from hotfix_lab.census.side import SideCensus, verdict_of

CENSUS = SideCensus("ddp", page="ddp", key=("release", "torch", "function", "case", "hotfix"), tool="ddp")
STORE, DOC, DIMENSION = CENSUS.store, CENSUS.doc, CENSUS.dimension
FIX, MECHANISM = "transformers-ddp-find-unused", "ddp-hidden-parameters"
#: the fix of the direct cases, and its mechanism per checkpoint function (the ranges: torch's, unsloth-zoo's)
DIRECT_FIX = "torch-ddp-find-unused"
DIRECT_MECHANISMS = {"torch": ("ddp-direct-checkpoint", "torch"), "unsloth": ("ddp-direct-unsloth", "unsloth-zoo")}
#: (checkpoint function, recipe) -> hotfix_lab.cases.ddp_cases's case name; unsloth's come last (its swap is process-wide)
CASES = {("torch", "lora"): "lora", ("torch", "full"): "full", ("torch", "direct"): "direct:remote",
         ("unsloth", "lora"): "unsloth:lora", ("unsloth", "full"): "unsloth:full",
         ("unsloth", "direct"): "unsloth:direct:remote"}
#: the page's column of each case
COLUMNS = {"lora": "LoRA", "full": "full", "direct": "direct call"}
#: the upstream error of the mechanism (what the fix repairs)
DEFECT = "Expected to mark a variable ready only once"


def row_of(release: str, function: str, recipe: str, hotfix: bool, result: Optional[Dict], why: str = "") -> Dict:
    """One case's result (ddp_cases.py) as a row: equal / wrong / crash / error."""
    verdict, detail = verdict_of(result, why, lambda r: f"{r['trainable']}/{r['trainable']} gradients equal")
    return dict(dimension=DIMENSION, release=release, function=function, case=recipe, hotfix=hotfix,
                verdict=verdict, detail=str(detail)[:300])


def run_release(release: str, hotfix: bool, sink, timeout: float) -> None:
    """One rank of tools/hotfix_lab/cases/ddp_cases.py on ``release``, every case, hotfix off or on."""
    from hotfix_lab.sweep import sweep_models

    install("transformers", release)
    peft = sweep_models.older_peft(release)
    if peft:
        install("peft", peft)
    found, why = runner.lab_rank("ddp_cases", list(CASES.values()), hotfix,
                                 sweep_models.release_pythonpath(release, "unsloth"), timeout)
    for (function, recipe), case in CASES.items():
        sink(row_of(release, function, recipe, hotfix, (found or {}).get("cases", {}).get(case), why))


# -- the page ---------------------------------------------------------------------------------------
def _word(row: Optional[Dict]) -> str:
    if row is None:
        return "not measured"
    if row["verdict"] == "crash" and DEFECT in row["detail"]:
        return "mark-ready twice"
    if row["verdict"] in ("crash", "error"):
        return f"{row['verdict']}: {row['detail'][:60]}"
    if row["verdict"] == "equal":
        return f"equal {row['detail'].split(' ')[0]}"
    return row["verdict"]


@CENSUS.page
def section(all_rows: List[Dict]) -> List[str]:
    """The page's lines: per torch line, a release per row, each case upstream -> with hotfix."""
    rows = CENSUS.rows(all_rows)
    out = ["# DDP with find_unused_parameters=True, reentrant checkpointing: every transformers release", "",
           "Rendered by tools/hotfix_lab/census/ddp.py from docs/census/ddp/ (one DDP rank, gloo, CPU; tools/hotfix_lab/cases/ddp_cases.py:",
           "a tiny Llama, LoRA on q_proj/v_proj or every parameter training, each gradient after DDP's all-reduce",
           "against DDP without checkpointing). Each cell: upstream -> with hotfix. \"mark-ready twice\": upstream's",
           f"\"{DEFECT}\" ({FIX}, docs/fixes/{FIX}.md). \"direct call\": a Hub-style `PreTrainedModel`",
           "whose own forward calls the `checkpoint` its module imported (tools/hotfix_lab/infra/remote_code_model.py), through",
           "torch's class and after unsloth's swap of its class in for torch's",
           f"({DIRECT_FIX}, docs/fixes/{DIRECT_FIX}.md).",
           ""]
    for torch in sorted({k[1] for k in rows}, key=Version):
        dates = sorted({r.get("date", "") for k, r in rows.items() if k[1] == torch})
        out += [f"## torch {torch} (measured {', '.join(d for d in dates if d)})", "",
                "| transformers | " + " | ".join(f"{f} {COLUMNS[r]}" for f, r in CASES) + " |",
                "|---|" + "---|" * len(CASES)]
        for release in sorted({k[0] for k in rows if k[1] == torch}, key=Version):
            cells = [f"{_word(rows.get((release, torch, f, r, False)))} -> {_word(rows.get((release, torch, f, r, True)))}"
                     for f, r in CASES]
            out.append(f"| {release} | " + " | ".join(cells) + " |")
        out.append("")
    return out


render = CENSUS.render


# -- the gate ---------------------------------------------------------------------------------------
def gate_problems(all_rows: List[Dict], patch) -> List[str]:
    """Where the fix's declared transformers range and the rows disagree.

    Inside the range, upstream must show the defect (torch's function, LoRA and full: the evidence for the
    range), and with hotfix every case must be equal; outside it, a release showing the defect upstream must
    be in ``unreached``.  Anywhere: with hotfix never worse than upstream.
    """
    from packaging.specifiers import SpecifierSet

    def holds(spec: Optional[str], release: str) -> bool:
        return spec is not None and SpecifierSet(spec).contains(release, prereleases=True)

    mechanism, problems = CENSUS.declared(patch, MECHANISM)
    if mechanism is None:
        return problems
    rows = CENSUS.rows(all_rows)
    out = []
    for (release, torch, function, recipe, hotfix), row in sorted(rows.items()):
        if hotfix or recipe == "direct":  # the direct cases are torch-ddp-find-unused's: direct_gate_problems
            continue
        where = f"{release} (torch {torch}, {function} {recipe})"
        fixed = rows.get((release, torch, function, recipe, True))
        inside = holds(mechanism.affected.get("transformers"), release)
        broken = row["verdict"] == "crash" and DEFECT in row["detail"]
        if function == "torch" and inside and not broken:
            out.append(f"{where} is inside the declared range but upstream: {_word(row)}")
        if broken and not (inside or holds(mechanism.unreached.get("transformers"), release)):
            out.append(f"{where} shows the defect upstream but is outside the declared range")
        if inside and (fixed is None or fixed["verdict"] != "equal") and row["verdict"] != "n/a":
            out.append(f"{where} is inside the range but with hotfix: {_word(fixed)}")
        if row["verdict"] == "equal" and (fixed is None or fixed["verdict"] != "equal"):
            out.append(f"{where}: upstream equal, with hotfix {_word(fixed)}")
    return out


def direct_gate_problems(all_rows: List[Dict], patch) -> List[str]:
    """Where torch-ddp-find-unused's declared ranges and the direct cases' rows disagree: the census's torch and
    unsloth-zoo releases are inside them, so upstream must show the defect and hotfix must be equal, every row."""
    from hotfix_lab.sweep import sweep_models
    from packaging.specifiers import SpecifierSet

    declared = {m.name: m for m in patch.mechanisms}
    rows = CENSUS.rows(all_rows, lambda r: r["case"] == "direct")
    out = []
    for (release, torch, function, recipe, hotfix), row in sorted(rows.items()):
        name, distribution = DIRECT_MECHANISMS[function]
        version = torch if distribution == "torch" else sweep_models.UNSLOTH_ZOO
        where = f"{release} (torch {torch}, {function} direct call, hotfix {'on' if hotfix else 'off'})"
        if name not in declared:
            out.append(f"{name}: not declared by {patch.name}")
        elif not SpecifierSet(declared[name].affected[distribution]).contains(version, prereleases=True):
            out.append(f"{where}: {distribution} {version} is outside {name}'s declared range")
        elif hotfix and row["verdict"] != "equal":
            out.append(f"{where}: {_word(row)}")
        elif not hotfix and not (row["verdict"] == "crash" and DEFECT in row["detail"]):
            out.append(f"{where} is inside the declared range but upstream: {_word(row)}")
    return out


@CENSUS.describes
def _describe(row: Dict) -> str:
    return f"[ddp {row['release']} {row['function']} {row['case']} hotfix {'on ' if row['hotfix'] else 'off'}] {_word(row)}"


def main(argv=None) -> int:
    return CENSUS.per_release_main(argv, __doc__.splitlines()[0], releases.transformers_releases(), run_release)


if __name__ == "__main__":
    sys.exit(main())
