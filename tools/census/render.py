"""docs/versions.md from the census rows: release x mechanism, upstream and with hotfix."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Dict, Iterable, List

from packaging.version import Version

import cells
import releases

BROKEN = ("wrong", "crash", "guard", "late")
TRANSFORMERS_MECHANISMS = ["keyword-tensors", "nested-outputs", "shared-mapping", "cache-contents", "unused-outputs",
                           "frozen-layer-inputs", "in-place-on-leaf", "tuple-embeddings"]
ZOO_MECHANISMS = ["closure-tensors", "frozen-first-input", "late-offload"]


def state(verdicts: Iterable[str]) -> str:
    """One word for a set of cell verdicts: broken beats unmeasured beats fine; n/a only when all are."""
    found = set(verdicts)
    if not found:
        return "–"
    if found & set(BROKEN):
        return "broken"
    if "error" in found:
        return "error"
    if found <= {"n/a"}:
        return "n/a"
    return "fine"


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
    import sweep_models  # tools/sweep is on sys.path wherever the census runs

    return sweep_models.OLDER_PEFT


def _gates(rows: List[Dict]) -> List[str]:
    """The declared ranges beside what the rows measured (tests/versions/test_version_gates.py checks them)."""
    import gates

    out = ["## Declared ranges (the version gates)", "",
           "Each fix applies where one of its mechanisms' declared ranges holds the installed version "
           "(`hotfix status --verbose`). *measured broken upstream*: the releases of this page where the "
           "mechanism's cases fail without hotfix (every torch measured). `tests/versions/test_version_gates.py` "
           "fails when a range and these rows disagree (`tools/census/gates.py`). The 4.35.0 bounds are where "
           "`_set_gradient_checkpointing(enable, gradient_checkpointing_func)`, the call every transformers fix "
           "hooks, first appeared; below it transformers calls torch's checkpoint from each model's own code, "
           "which hotfix does not reach (*not reached*: `hotfix status` says NOT COVERED there; 4.34.1 crashes "
           "in `enable_input_require_grads` on GIT and Swin as 4.35 does), and nothing else is measured: the "
           "census's checker asks for `gradient_checkpointing_kwargs`, which 4.34 does not take.", "",
           "| mechanism | fix | declared range | fixed in | measured broken upstream |", "|---|---|---|---|---|"]
    broken: Dict[str, List[str]] = {}
    for (dimension, _torch, name, release), states in sorted(gates.verdicts(rows).items()):
        if states["upstream"] == "broken" and release not in broken.setdefault(name, []):
            broken[name].append(release)
    for fix in gates.builtin_fixes():
        for mechanism in fix.mechanisms:
            ranges = "; ".join(f"{dist} {spec}" for dist, spec in mechanism.affected.items())
            ranges += "".join(f" (not reached: {dist} {spec})" for dist, spec in mechanism.unreached.items())
            found = sorted(broken.get(mechanism.name, []), key=Version)
            span = (f"{found[0]} – {found[-1]} ({len(found)} releases)" if len(found) > 1 else
                    (found[0] if found else "none"))
            out.append(f"| {mechanism.name} | `{fix.name}` | {ranges} | {mechanism.fixed_in or '–'} | {span} |")
    return out + [""]


def render(rows: List[Dict], doc: Path) -> None:
    dates = sorted({r["date"] for r in rows})
    torches = sorted({r["torch"] for r in rows}, key=Version)
    out = ["# Versions: every mechanism, measured on every release line", "",
           "Generated by `python tools/census/census.py` (see its docstring) from the rows in `docs/census/`;",
           f"measured {dates[0] if dates else '–'} to {dates[-1] if dates else '–'} on a {_machine()}, CPU only, "
           f"torch {', '.join(torches) or '–'}.", "",
           "Each cell: upstream (hotfix off) → with hotfix, over the mechanism's cases (`tools/census/cells.py`) "
           "and both checkpoint functions (torch's reentrant checkpoint, unsloth-zoo's "
           "`UnslothCheckpointFunction` loaded on CPU). *broken*: a case crashed, lost or changed gradients "
           "(against the same step without checkpointing, float32; a case whose only differences are values within "
           f"{cells.ROUNDING_SIZED:g} is measured again in float64 and counts as equal if it is equal there: "
           "rounding), tripped the memory/time guard, or (late-offload) "
           "offloaded nothing in step 1; *fine*: every case equal; *n/a*: the release has no such model or "
           "code path; *error*: a case could not be built or run (measured again by the next run); "
           "**BROKEN** with hotfix is listed below with its mechanism. The LoRA cells run the test venv's PEFT, "
           f"below transformers {_older_peft()[0]} PEFT {_older_peft()[1]} (newer PEFT does not import there).", ""]
    broken_with_hotfix = [r for r in rows if r["hotfix"] and r["verdict"] in BROKEN]
    for torch in torches:
        mine = [r for r in rows if r["torch"] == torch]
        trows = [r for r in mine if r["dimension"] == "transformers"]
        if trows:
            order = [v for v in releases.transformers_releases() if any(r["release"] == v for r in trows)]
            expected = len(releases.transformers_releases())
            out += [f"## transformers, torch {torch} ({len(order)} of {expected} releases measured)", ""]
            out += _table(trows, "transformers", TRANSFORMERS_MECHANISMS, order, {})
            out.append("")
        zrows = [r for r in mine if r["dimension"] == "unsloth-zoo"]
        if zrows:
            pairs = dict(releases.zoo_releases())
            order = [z for z, _ in releases.zoo_releases() if any(r["release"] == z for r in zrows)]
            out += [f"## unsloth-zoo, torch {torch} ({len(order)} of {len(pairs)} releases measured)", "",
                    "Each release with the transformers line it was made for (`tools/census/releases.py`).", ""]
            out += _table(zrows, "unsloth-zoo", ZOO_MECHANISMS, order, pairs)
            out.append("")
    out += _gates(rows)
    out += ["## Broken with hotfix", ""]
    if not broken_with_hotfix:
        out.append("None.")
    for r in sorted(broken_with_hotfix, key=lambda r: (r["torch"], r["dimension"], Version(r["release"]), r["case"])):
        why = cells.BROKEN_WITH_HOTFIX.get((r["case"], r["release"]), "NOT EXPLAINED")
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
