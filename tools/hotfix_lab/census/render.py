"""docs/versions.md from the census rows: release x mechanism, upstream and with hotfix."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Dict, List

from packaging.version import Version

from hotfix_lab.census import boundaries
from hotfix_lab.census import cells
from hotfix_lab.census import gates
from hotfix_lab.census import releases
from hotfix_lab.census.cells import BROKEN, state

TRANSFORMERS_MECHANISMS = ["keyword-tensors", "nested-outputs", "shared-mapping", "cache-contents", "unused-outputs",
                           "frozen-layer-inputs", "in-place-on-leaf", "tuple-embeddings"]
ZOO_MECHANISMS = ["closure-tensors", "frozen-first-input", "late-offload"]


def _cell(rows: List[Dict]) -> str:
    upstream = state(r["verdict"] for r in rows if not r["hotfix"])
    fixed = state(r["verdict"] for r in rows if r["hotfix"])
    if upstream == "–" and fixed == "–":
        return "not measured"
    if upstream == fixed == "n/a":
        return "n/a"
    if upstream == "fine" and fixed == "fine":
        return "fine"
    fixed_word = {"fine": "equal", "broken": "**BROKEN**", "error": "error", "n/a": "n/a", "–": "not measured"}[fixed]
    return f"{upstream} → {fixed_word}"


def _machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{os.cpu_count()}-core {platform.machine()} VM ({model or 'CPU model unknown'}), Python {platform.python_version()}"


def _table(rows: List[Dict], dimension: str, mechanisms: List[str], order: List[str], paired: Dict[str, str]) -> List[str]:
    head = "| release | " + ("transformers | " if paired else "") + " | ".join(mechanisms) + " |"
    lines = [head, "|" + "---|" * (len(mechanisms) + 1 + bool(paired))]
    for release in order:
        mine = [r for r in rows if r["release"] == release]
        cells_ = [_cell([r for r in mine if r["mechanism"] == m]) for m in mechanisms]
        lines.append(f"| {release} | " + (f"{paired.get(release, '')} | " if paired else "") + " | ".join(cells_) + " |")
    return lines


def _older_peft():
    from hotfix_lab.sweep import sweep_models  # tools/hotfix_lab/sweep is on sys.path wherever the census runs

    return sweep_models.OLDER_PEFT


def _rounding_sized() -> float:
    from hotfix_lab.sweep import sweep_rounding  # tools/hotfix_lab/sweep is on sys.path wherever the census runs

    return sweep_rounding.ROUNDING_SIZED


#: fix -> where the evidence of mechanisms this census does not measure lives
OTHER_EVIDENCE = {
    "axolotl-offload-checkpoint": "[census/forks.md](census/forks.md), every release",
    "llamafactory-unsloth-gc": "[census/forks.md](census/forks.md), every release",
    "unsloth-zoo-nonreentrant-offload": "[census/zoo-nonreentrant.md](census/zoo-nonreentrant.md), every release",
    "transformers-ddp-find-unused": "[census/ddp.md](census/ddp.md), every release, torch 2.13 and 2.14",
    "torch-ddp-find-unused": "[census/ddp.md](census/ddp.md) (direct call), every release, torch 2.13 and 2.14",
    "torch-checkpoint-wrapper": "[census/wrapper.md](census/wrapper.md), every release from 4.52",
    # DeepSpeed's census has rows and a gate test of its own (tools/hotfix_lab/census/deepspeed_census.py,
    # tests/versions/test_deepspeed_census.py); its cases use torch's checkpoint, not DeepSpeed's
    "deepspeed-zero3-frozen-recompute": "[census/deepspeed.md](census/deepspeed.md), every DeepSpeed line that runs "
                                        "on torch 2.13 and 2.14",
    "moe-routing-replay": "[census/moe-routing.md](census/moe-routing.md): every MoE type of 4.56.2 and 5.24.0, "
                          "torch 2.13, with the drift device (no release replays routing); the fused router: "
                          "tests/versions/test_moe_routing_call_sites.py (unsloth-zoo 2026.10.9, its kernel stood in "
                          "for on CPU, and its Qwen3-MoE block forward; the range read in the releases' files: "
                          "2026.10.8 added the fused router)",
    "torch-checkpoint-rng-state": "tests/unit/test_torch_checkpoint_rng_state.py (dropout, both modes), on torch 2.13 "
                                  "alone",
    "torch-compile-recompute-graph": "tests/unit/test_torch_compile_recompute_graph.py (inductor, non-reentrant), on "
                                     "torch 2.13 alone",
    "unsloth-zoo-pinned-memory": "tests/versions/test_unsloth_zoo_pinned_memory.py (2025.11.3, 2026.8.9: a CPU torch "
                                 "refuses pinned memory); the range read in the releases' code",
    "deepspeed-checkpoint-layer-io": "DeepSpeed 0.19.8 (tests/e2e/test_deepspeed.py, tests/versions/"
                                     "test_deepspeed_partitioned_activations.py, torch 2.13; not a case of "
                                     "census/deepspeed.md)",
}


def _gates(rows: List[Dict]) -> List[str]:
    """The declared ranges beside what the rows measured (tests/versions/test_version_gates.py checks them)."""
    out = ["## Declared ranges (the version gates)", "",
           "Each fix applies where one of its mechanisms' declared ranges holds the installed version "
           "(`hotfix status --verbose`). *measured broken upstream*: the releases of this page where the "
           "mechanism's cases fail without hotfix (every torch measured). `tests/versions/test_version_gates.py` "
           "fails when a range and these rows disagree (`tools/hotfix_lab/census/gates.py`). The 4.35.0 bounds are where "
           "`_set_gradient_checkpointing(enable, gradient_checkpointing_func)`, the call every transformers fix "
           "hooks, first appeared; below it transformers calls torch's checkpoint from each model's own code, "
           "which hotfix does not reach (*not reached*: `hotfix status` says NOT COVERED there; 4.34.1 crashes "
           "in `enable_input_require_grads` on GIT and Swin as 4.35 does), and nothing else is measured: the "
           "census's checker asks for `gradient_checkpointing_kwargs`, which 4.34 does not take. *lost upstream*: "
           "releases where upstream drops the mechanism's state before any checkpoint function sees it "
           "(`hotfix.Lost`): broken with hotfix too, and `hotfix status` / `hotfix doctor` say NOT COVERED there, "
           "with the reason (under *Broken with hotfix* below).", "",
           "| mechanism | fix | declared range | fixed in | measured broken upstream |", "|---|---|---|---|---|"]
    broken: Dict[str, List[str]] = {}
    verdicts = gates.verdicts(rows)
    measured = {name for _, _, name, _ in verdicts}
    for (dimension, _torch, name, release), states in sorted(verdicts.items()):
        if states["upstream"] == "broken" and release not in broken.setdefault(name, []):
            broken[name].append(release)
    for fix in releases.builtin_fixes():
        for mechanism in fix.mechanisms:
            ranges = "; ".join(f"{dist} {spec}" for dist, spec in mechanism.affected.items())
            ranges += "".join(f" (not reached: {dist} {spec})" for dist, spec in mechanism.unreached.items())
            ranges += "".join(f" (lost upstream: {dist} {spec})" for lost in mechanism.lost
                              for dist, spec in lost.affected.items())
            found = sorted(broken.get(mechanism.name, []), key=Version)
            span = (f"{found[0]} – {found[-1]} ({len(found)} releases)" if len(found) > 1 else
                    (found[0] if found else "none"))
            if mechanism.name not in measured:
                span = f"not in these rows: {OTHER_EVIDENCE.get(fix.name, 'not measured')}"
            out.append(f"| {mechanism.name} | `{fix.name}` | {ranges} | {mechanism.fixed_in or '–'} | {span} |")
    return out + [""]


def _line_release(rows: List[Dict], torch: str) -> str:
    """The transformers release a torch line was measured on: releases.TORCH_LINE_RELEASE where its rows have it."""
    measured = {r["release"] for r in rows if r["torch"] == torch and r["dimension"] in ("transformers", "compile")}
    if releases.TORCH_LINE_RELEASE in measured or not measured:
        return releases.TORCH_LINE_RELEASE
    return sorted(measured, key=Version)[-1]


def _counts_differ(rows: List[Dict]) -> List[str]:
    """The compile cases whose dynamo counts differ between hotfix off and on (same torch, release, function), where
    both trained (a crash has no counts: it is listed under "Broken with hotfix")."""
    pairs: Dict[tuple, Dict[bool, Dict]] = {}
    for r in rows:
        if r["dimension"] == "compile" and r["verdict"] not in ("n/a", "crash"):
            pairs.setdefault((r["torch"], r["release"], r["function"], r["case"]), {})[r["hotfix"]] = r
    return [f"{case} ({function}, torch {torch})" for (torch, release, function, case), pair in sorted(pairs.items())
            if len(pair) == 2 and any(pair[False].get(k) != pair[True].get(k) for k in cells.COMPILE_COUNTS)]


def _torch_of(differ: str) -> str:
    return differ.rsplit("torch ", 1)[1].rstrip(")")


def _torch_lines(rows: List[Dict]) -> List[str]:
    """Every torch line: the mechanisms on one transformers release, and the compile column."""
    lines_ = releases.torch_lines()
    measured = [t for t in lines_ if any(r["torch"] == t for r in rows)]
    compile_cases = [f"compile/{m}/{b}" for m, b in cells.COMPILE_CASES
                     if any(r["case"] == f"compile/{m}/{b}" for r in rows)]  # (inductor: where measured)
    out = [f"## torch lines ({len(measured)} of {len(lines_)} measured)", "",
           f"The last patch of every torch minor line {lines_[0]} – {lines_[-1]} (PyPI's builds, on the CPU), each with "
           f"transformers {releases.TORCH_LINE_RELEASE}, or the release of that torch's time where "
           f"{releases.TORCH_LINE_RELEASE} does not import with it (`tools/hotfix_lab/census/releases.py`). Mechanism cells as "
           "above; *functions*: the checkpoint functions measured (unsloth-zoo's where it loads under that torch). "
           "*compile*: Whisper and a Llama with reentrant checkpointing under `torch.compile` "
           "(`tools/hotfix_lab/cases/compile_case.py`), eager and inductor backends, two training steps, every gradient against "
           "an uncompiled step without checkpointing, through torch's function / unsloth's; *counts*: dynamo's "
           "graphs, graph breaks, compiled frames and recompiles, hotfix on against off. The inductor backend "
           "compiles C++ kernels with the host compiler (a cell 1 - 3 minutes on the 2-core CPU machine).", "",
           "| torch | transformers | functions | " + " | ".join(TRANSFORMERS_MECHANISMS) + " | "
           + " | ".join(c.split("/", 1)[1] for c in compile_cases) + " | counts |",
           "|" + "---|" * (4 + len(TRANSFORMERS_MECHANISMS) + len(compile_cases))]
    differ = _counts_differ(rows)
    for torch in lines_:
        release = _line_release(rows, torch)
        mine = [r for r in rows if r["torch"] == torch and r["release"] == release]
        trows = [r for r in mine if r["dimension"] == "transformers"]
        crows = [r for r in mine if r["dimension"] == "compile"]
        functions = sorted({r["function"] for r in trows + crows if "does not load under torch" not in r["detail"]})
        line = [torch, release if mine else "–", ", ".join(functions) or "–"]
        line += [_cell([r for r in trows if r["mechanism"] == m]) for m in TRANSFORMERS_MECHANISMS]
        line += [" / ".join(_cell([r for r in crows if r["case"] == c and r["function"] == f]) for f in ("torch", "unsloth"))
                 for c in compile_cases]
        mine_differ = [d for d in differ if d.endswith(f"torch {torch})")]
        line.append("not measured" if not crows else ("**differ**" if mine_differ else "equal"))
        out.append("| " + " | ".join(line) + " |")
    unsupported = sorted({(r["torch"], r["detail"]) for r in rows if r["verdict"] == "n/a" and r["function"] == "unsloth"
                          and "does not load under torch" in r["detail"]}, key=lambda item: Version(item[0]))
    if unsupported:
        out += ["", "unsloth's function not measured:"] + [f"- torch {torch}: {detail}" for torch, detail in unsupported]
    if differ:
        out += ["", "Dynamo's counts differ with hotfix (open defects):"]
        out += [f"- {d}: {cells.COMPILE_DIFFERS_WITH_HOTFIX.get(_torch_of(d), 'NOT EXPLAINED')}" for d in differ]
    defects = [torch for torch in lines_ if torch in cells.COMPILE_OPEN_DEFECTS]
    if defects:
        out += ["", "hotfix breaks `torch.compile` where upstream trains (open defects; use `use_reentrant=False` or "
                "another torch line there):"]
        out += [f"- torch {torch}: {cells.COMPILE_BROKEN_WITH_HOTFIX[(torch, 'torch')]}" for torch in defects]
    return out + [""]


def _lost(row: Dict) -> str:
    """Where the row's mechanism declares its release lost upstream: that reason, as hotfix status words it."""
    why = gates.lost_reason(row["mechanism"], row["dimension"], row["release"], releases.builtin_fixes(),
                            cells.model_type_of(row["case"]))
    return f"declared lost upstream (`hotfix status` says NOT COVERED): {why}" if why else ""


def _boundaries(rows: List[Dict], torch: str) -> List[str]:
    """The bisect of hotfix_lab.census.boundaries under ``torch``: each line's first patch release against its last,
    and where they disagree, those cells on every release between."""
    found = boundaries.lines(rows, torch)
    checked = [line for line in found if line.measured]
    if not checked:
        return []
    mine = [r for r in rows if r["dimension"] == "transformers" and not r.get("line") and r["torch"] == torch]
    out = [f"## transformers patch releases at boundaries, torch {torch} ({len(checked)} of {len(found)} lines "
           "checked)", "",
           "The tables above take each line's last patch release; a mechanism's state can change inside a line "
           "(Gemma-4 shared its keys/values through the Cache on 5.5.0 - 5.5.1, which checkpointing drops: "
           "huggingface/transformers#45242, moved out of it in 5.5.2 by #45312). The bisect (`census.py --bisect`, "
           "`tools/hotfix_lab/census/boundaries.py`) measures the first patch release of every line that has several, and where "
           "its first and last patch release disagree on a cell (a verdict through either function, hotfix off or "
           "on), that cell on every release between. A window that opens and closes strictly inside a line is not "
           "seen. Cells as above, both functions; a line checked on some cells only says which.", ""]
    every = {f"{model}/{recipe}" for model, recipe, _ in cells.CELLS} | {f"lab/{case}" for case, _ in cells.LAB_CELLS}

    def which(line) -> str:
        return "" if every <= set(line.compared) else f" (only {', '.join(line.compared)})"

    agree = [line for line in checked if not line.disagree]
    if agree:
        out += ["First and last patch release agree on every cell compared: "
                + ", ".join(f"{line.releases[0]} / {line.releases[-1]}{which(line)}" for line in agree) + ".", ""]
    for line in checked:
        if line.disagree:
            out += [f"{line.releases[0]} / {line.releases[-1]}{which(line)}:", ""]
            out += ["| cell | " + " | ".join(line.releases) + " |", "|" + "---|" * (len(line.releases) + 1)]
            for case in line.disagree:
                out.append(f"| {case} | " + " | ".join(
                    _cell([r for r in mine if r["release"] == release and r["case"] == case])
                    for release in line.releases) + " |")
            out.append("")
    unchecked = [line.releases[0] for line in found if not line.measured]
    if unchecked:
        out += [f"Not checked yet (no rows of the first patch release): {', '.join(unchecked)}.", ""]
    return out


def render(rows: List[Dict], doc: Path) -> None:
    dates = sorted({r["date"] for r in rows})
    torches = sorted({r["torch"] for r in rows}, key=Version)
    out = ["# Versions: every mechanism, measured on every release line", "",
           "Generated by `python -P -m hotfix_lab.census.census` (see its docstring) from the rows in `docs/census/`;",
           f"measured {dates[0] if dates else '–'} to {dates[-1] if dates else '–'} on a {_machine()}, CPU only, "
           f"torch {', '.join(torches) or '–'}.", "",
           "Each cell: upstream (hotfix off) → with hotfix, over the mechanism's cases (`tools/hotfix_lab/census/cells.py`) "
           "and both checkpoint functions (torch's reentrant checkpoint, unsloth-zoo's "
           "`UnslothCheckpointFunction` loaded on CPU). *broken*: a case crashed, lost or changed gradients "
           "(against the same step without checkpointing, float32; a case whose only differences are values within "
           f"{_rounding_sized():g} is measured again in float64 and counts as equal if it is equal there: "
           "rounding), tripped the memory/time guard, or (late-offload) "
           "offloaded nothing in step 1; *fine*: every case equal; *n/a*: the release has no such model or "
           "code path; *error*: a case could not be built or run (measured again by the next run); "
           "**BROKEN** with hotfix is listed below with its mechanism. The LoRA cells run the test venv's PEFT, "
           f"below transformers {_older_peft()[0]} PEFT {_older_peft()[1]} (newer PEFT does not import there).", ""]
    broken_with_hotfix = [r for r in rows if r["hotfix"] and r["verdict"] in BROKEN]
    out += _torch_lines(rows)
    for torch in torches:
        mine = [r for r in rows if r["torch"] == torch]
        trows = [r for r in mine if r["dimension"] == "transformers" and not r.get("line")]
        if trows:
            order = [v for v in releases.transformers_releases() if any(r["release"] == v for r in trows)]
            expected = len(releases.transformers_releases())
            out += [f"## transformers, torch {torch} ({len(order)} of {expected} releases measured)", ""]
            out += _table(trows, "transformers", TRANSFORMERS_MECHANISMS, order, {})
            out.append("")
            out += _boundaries(rows, torch)
        zrows = [r for r in mine if r["dimension"] == "unsloth-zoo"]
        if zrows:
            pairs = dict(releases.zoo_releases())
            order = [z for z, _ in releases.zoo_releases() if any(r["release"] == z for r in zrows)]
            out += [f"## unsloth-zoo, torch {torch} ({len(order)} of {len(pairs)} releases measured)", "",
                    "Each release with the transformers line it was made for (`tools/hotfix_lab/census/releases.py`).", ""]
            out += _table(zrows, "unsloth-zoo", ZOO_MECHANISMS, order, pairs)
            out.append("")
    out += _gates(rows)
    out += ["## Broken with hotfix", ""]
    if not broken_with_hotfix:
        out.append("None.")
    for r in sorted(broken_with_hotfix, key=lambda r: (r["torch"], r["dimension"], Version(r["release"]), r["case"])):
        why = cells.broken_reason(r) or _lost(r) or "NOT EXPLAINED"
        out.append(f"- {r['dimension']} {r['release']} (torch {r['torch']}, {r['function']}): {r['case']} "
                   f"[{r['mechanism']}]: {r['verdict']}: {r['detail']}. Why: {why}")
    errors = [r for r in rows if r["verdict"] == "error"]
    if errors:
        out += ["", f"## Cells that could not be measured ({len(errors)})", ""]
        for r in sorted(errors, key=lambda r: (r["torch"], r["dimension"], Version(r["release"]), r["case"], r["hotfix"])):
            out.append(f"- {r['dimension']} {r['release']} (torch {r['torch']}, {r['function']}, hotfix "
                       f"{'on' if r['hotfix'] else 'off'}): {r['case']}: {r['detail']}")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(out) + "\n")
