#!/usr/bin/env python3
"""MoE routing under checkpointing: every MoE model type of a transformers line, both modes, with the drift a GPU makes.

    python -P -m hotfix_lab.census.moe_routing [--lines 4.56.2,5.24.0] [--only TYPE,...] [--page docs/census/moe-routing.md]

For each transformers line (4.56.2: the test venv's own; others: tests/matrix.txt's release in .matrix/) the MoE model
types are read from that release's modeling code (hotfix_lab.cases.moe_cases ``moe_types``: a causal LM whose modeling
code calls ``topk``, whose config counts experts).  Each type is built tiny (random weights, 2 layers, 8 experts, top
2), its routers tied and drifted during the recomputation only (moe_cases' drift device), and trained one step with
reentrant and with non-reentrant checkpointing through transformers' enabler against the same step without
checkpointing: in one child without hotfix (HOTFIX_DISABLE=1) and one with it.  Also: Qwen3-MoE with peft LoRA on q,
v and the router (a 4.x router is an ``nn.Linear``; on a 5.x router, a bare weight, through peft's
``target_parameters``), and
Qwen3-MoE / Mixtral without drift, whose checkpointed gradients must be bit-identical with and without hotfix.

Exit status 0 when every buildable cell is equal with hotfix, fails without it (drift cases), and the no-drift
digests agree; 1 otherwise.  tests/versions/test_moe_routing_census.py runs it and holds docs/census/moe-routing.md
to what the run renders.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

from hotfix_lab.infra.paths import REPO, TOOLS

PAGE = REPO / "docs" / "census" / "moe-routing.md"
#: the transformers lines measured: the venv's own, and the latest 5.x of tests/matrix.txt
LINES = ("4.56.2", "5.24.0")
MODES = ("reentrant", "non-reentrant")
#: extra cases on every line: LoRA on the router, and no drift at all (bit-identical with and without hotfix)
EXTRA = ("qwen3_moe:reentrant:lora", "qwen3_moe:non-reentrant:lora", "qwen3_moe:reentrant:nodrift",
         "qwen3_moe:non-reentrant:nodrift", "mixtral:reentrant:nodrift", "mixtral:non-reentrant:nodrift")


#: MoE types whose routing decides by something else than topk, out of the replay's reach (the census holds them
#: failing with hotfix too: the day they pass, this list is wrong)
NOT_COVERED: Dict[str, str] = {}


def _pythonpath(line: str) -> List[str]:
    from importlib.metadata import version  # the venv's own line needs no path (read, not imported)

    if version("transformers") == line:
        return [str(TOOLS)]
    folder = REPO / ".matrix" / f"transformers-{line}"
    if not folder.is_dir():
        raise SystemExit(f"{folder} is not installed (scripts/test.sh installs tests/matrix.txt)")
    return [str(folder), str(TOOLS)]


def _child(line: str, arguments: List[str], hotfix: bool, timeout: float = 1500) -> List[Dict]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HOTFIX_", "PYTHON"))}
    env.update(PYTHONPATH=os.pathsep.join(_pythonpath(line)), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    if not hotfix:
        env["HOTFIX_DISABLE"] = "1"
    proc = subprocess.run([sys.executable, "-P", "-m", "hotfix_lab.cases.moe_cases", *arguments], capture_output=True, text=True, env=env,
                          cwd=str(TOOLS), timeout=timeout)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        rows.append({"case": "?", "status": "error", "error": f"rc {proc.returncode}: {tail}"})
    return rows


def measure(lines: List[str], only: Optional[List[str]], jobs: int) -> Dict[str, Dict[str, List[Dict]]]:
    """line -> {"upstream": rows, "hotfix": rows}."""
    cases = {}
    for line in lines:
        types = only or json.loads(subprocess.run(
            [sys.executable, "-P", "-m", "hotfix_lab.cases.moe_cases", "--types"], capture_output=True, text=True, cwd=str(TOOLS),
            check=True,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
                 "PYTHONPATH": os.pathsep.join(_pythonpath(line)), "HOTFIX_DISABLE": "1"}).stdout)
        cases[line] = [f"{model}:{mode}" for model in types for mode in MODES] + list(EXTRA)
    work = [(line, side) for line in lines for side in ("upstream", "hotfix")]
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda item: _child(item[0], cases[item[0]], item[1] == "hotfix"), work))
    measured: Dict[str, Dict[str, List[Dict]]] = {}
    for (line, side), rows in zip(work, results):
        measured.setdefault(line, {})[side] = rows
    return measured


def cell(row: Optional[Dict]) -> str:
    if row is None:
        return "-"
    status = row["status"]
    if status == "equal":
        return f"equal ({row['total']})"
    if status == "differs":
        missing = f", {row['missing'] + row['unexpected']} missing" if row["missing"] + row["unexpected"] else ""
        equal = row["total"] - row["wrong"] - row["missing"] - row["unexpected"]
        return f"WRONG: {equal}/{row['total']} equal{missing}"
    if status == "crash":
        error = row["error"]
        for known in ("different metadata", "different number of tensors", "does not require grad"):
            if known in error:
                return f"CRASH: {error.split(':')[0]} ({known})"
        return f"CRASH: {error[:90]}"
    return f"n/a: {row.get('error', '')[:90]}"


def problems(measured: Dict[str, Dict[str, List[Dict]]]) -> List[str]:
    found = []
    for line, sides in measured.items():
        upstream = {row["case"]: row for row in sides["upstream"]}
        for row in sides["hotfix"]:
            case, before = row["case"], upstream.get(row["case"])
            if row["status"] == "error" or before is None:
                found.append(f"{line} {case}: {row.get('error', 'no upstream row')}")
            elif "nodrift" in case:
                if row.get("digest") != before.get("digest"):
                    found.append(f"{line} {case}: gradients not bit-identical to upstream's")
            elif before["status"] == "n/a":
                if row["status"] != "n/a":
                    found.append(f"{line} {case}: n/a upstream, {row['status']} with hotfix")
            elif case.split(":")[0] in NOT_COVERED:
                if row["status"] == "equal":
                    found.append(f"{line} {case}: equal with hotfix, yet listed NOT_COVERED")
            elif row["status"] != "equal":
                found.append(f"{line} {case}: upstream {before['status']}, hotfix {row['status']}")
    return found


def render(measured: Dict[str, Dict[str, List[Dict]]]) -> str:
    out = [
        "# MoE routing under checkpointing: census",
        "",
        "Made by `python -P -m hotfix_lab.census.moe_routing` (run by tests/versions/test_moe_routing_census.py in CI, which",
        "renders this page again and fails where it differs). torch 2.13.0 CPU; each transformers line's MoE model",
        "types read from its modeling code (a causal LM whose code calls `topk`, whose config counts experts). Each",
        "type tiny (2 layers, 8 experts, top 2, random weights), its routers' rows tied in groups of 3 and, during",
        "a recomputation only, scaled by 1 +- 1e-6 (the last-bit drift a GPU's nondeterministic kernels make: the",
        "recomputation breaks each tie its own way). One step with checkpointing (transformers' enabler,",
        "`use_reentrant` True / False) against the same step without, every trainable gradient at 1e-4 relative",
        "(none missing). \"upstream\": HOTFIX_DISABLE=1; \"hotfix\": as installed. \"n/a\": the tiny builder",
        "cannot make or train that type on CPU (the reason shown): not measured. An upstream cell \"equal\": the",
        "drift device made no token change experts there (another routing rule), so that row shows nothing either way.",
        "",
    ]
    if NOT_COVERED:
        out += ["Not covered:", ""]
        out += [f"- {model}: {reason}" for model, reason in NOT_COVERED.items()]
        out.append("")
    out += ["The routers are reached where their code calls `topk` (its choice replayed) or a module-level helper",
            "that samples experts (PhiMoE's `sparsemixer`: handed the forward's scores in the recomputation); each",
            "step starts from the same seed (a sampling router draws alike in both).", ""]
    for line, sides in measured.items():
        upstream = {row["case"]: row for row in sides["upstream"]}
        hotfix = {row["case"]: row for row in sides["hotfix"]}
        types = list(dict.fromkeys(case.split(":")[0] for case in upstream if case.count(":") == 1))
        out += [f"## transformers {line}", "",
                "| model type | reentrant, upstream | reentrant, hotfix | non-reentrant, upstream "
                "| non-reentrant, hotfix |",
                "|---|---|---|---|---|"]
        for model in types:
            cells = [cell(side.get(f"{model}:{mode}")) for mode in MODES for side in (upstream, hotfix)]
            if len(set(cells)) == 1 and cells[0].startswith("n/a"):  # not built or not trained: one reason
                cells = [cells[0], "-", "-", "-"]
            name = f"{model} (NOT COVERED)" if model in NOT_COVERED else model
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out += ["", "| case | upstream | hotfix |", "|---|---|---|"]
        for case in EXTRA:
            before, after = upstream.get(case), hotfix.get(case)
            if "nodrift" in case:
                same = before is not None and after is not None and before.get("digest") == after.get("digest")
                out.append(f"| {case} | {cell(before)} | {cell(after)}, "
                           f"{'bit-identical to upstream' if same else 'NOT bit-identical'} |")
            else:
                out.append(f"| {case} | {cell(before)} | {cell(after)} |")
        out.append("")
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--lines", default=",".join(LINES))
    parser.add_argument("--only", help="comma list of model types (default: every MoE type of each line)")
    parser.add_argument("--page", type=Path, help="write the page here")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    measured = measure(args.lines.split(","), args.only.split(",") if args.only else None, args.jobs)
    for line, sides in measured.items():
        for side, rows in sides.items():
            for row in rows:
                print(json.dumps({"line": line, "side": side, **row}), flush=True)
    if args.page:
        args.page.write_text(render(measured))
    found = problems(measured)
    for problem in found:
        print("PROBLEM " + problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
