"""Turn a GPU-kit run's files in OUT into results.json and report.md (ratios from one run).

    python tools/gpu/report.py OUT

Reads OUT/environment.json (tools/gpu/environment.py), OUT/gpu-tests.xml
(pytest's junit file) and OUT/bench.json (tools/gpu/bench.py).  The three
targets of issue 10 are reported, never asserted:
  step-1 peak, hotfix + 2025.11.3 / upstream 2025.11.5     target: within 2 %
  steady peak, hotfix / use_reentrant=False, largest common batch   target: <= 0.8
  median step time, hotfix / use_reentrant=False, same batch        target: <= 1.10
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET

HOTFIX_VARIANTS = ("hotfix+zoo-2025.11.3", "hotfix+zoo-2026.10.9")


def _load(path, default):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def tests_summary(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {"ran": False}
    cases = []
    for case in root.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        cases.append({"name": case.get("name"), "outcome": outcome, "seconds": float(case.get("time", 0))})
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    return {"ran": True, **counts, "cases": cases}


def sanitizer_summary(path):
    """What CUDA's stream sanitizer said (scripts/gpu/run's sanitizer step): per release, races reported,
    exit status and the JSON result line; None when the step did not run."""
    try:
        text = open(path).read()
    except OSError:
        return None
    releases = {}
    for block in text.split("## unsloth-zoo ")[1:]:
        version, _, body = block.partition("\n")
        rows = [json.loads(line) for line in body.splitlines() if line.startswith("{")]
        status = [line.split()[-1] for line in body.splitlines() if line.startswith("exit status")]
        releases[version.strip()] = {"races": body.count("CSAN detected a possible data race"),
                                     "exit_status": int(status[-1]) if status else None,
                                     "result": rows[0] if rows else None}
    return releases


def _ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def _ok(rows, variant):
    return {r["batch"]: r for r in rows if r.get("variant") == variant and r.get("status") == "ok"}


def targets(rows):
    out = {}
    fixed, upstream = _ok(rows, "hotfix+zoo-2025.11.3"), _ok(rows, "zoo-2025.11.5")
    common = sorted(set(fixed) & set(upstream))
    if common:
        b = common[0]
        out["step1_peak_hotfix_2025_11_3_over_upstream_2025_11_5"] = {
            "batch": b, "ratio": _ratio(fixed[b]["step1_peak"], upstream[b]["step1_peak"]), "target": "within 2 % of 1.0"}
    workaround = _ok(rows, "non-reentrant")
    for variant in HOTFIX_VARIANTS:
        mine = _ok(rows, variant)
        shared = sorted(set(mine) & set(workaround))
        if not shared:
            continue
        b = shared[-1]
        out[f"steady_peak_{variant}_over_non_reentrant"] = {
            "batch": b, "ratio": _ratio(mine[b]["steady_peak"], workaround[b]["steady_peak"]), "target": "<= 0.8"}
        out[f"step_time_{variant}_over_non_reentrant"] = {
            "batch": b, "ratio": _ratio(mine[b]["median_s"], workaround[b]["median_s"]), "target": "<= 1.10"}
    return out


def _mib(value):
    return "–" if value is None else f"{value / 2**20:,.0f} MiB"


def markdown(env, tests, bench, found, sanitizer=None):
    lines = ["# GPU kit results", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += ["", "## GPU tests", ""]
    if tests.get("ran"):
        lines.append(f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped")
        lines += [f"- {c['outcome']}: {c['name']} ({c['seconds']:.1f} s)" for c in tests["cases"]]
    else:
        lines.append("not run")
    lines += ["", "## CUDA stream sanitizer (TORCH_CUDA_SANITIZER=1) over hotfix's offloader", ""]
    if not sanitizer:
        lines.append("not run")
    for version, found_here in (sanitizer or {}).items():
        result = found_here["result"] or {}
        lines.append(f"- unsloth-zoo {version}: {found_here['races']} race(s) reported, exit status "
                     f"{found_here['exit_status']}, status {result.get('status', '–')}, gradients equal "
                     f"{result.get('grads_equal', '–')}")
    lines += ["", "## Benchmark", ""]
    settings = bench.get("settings", {})
    lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items() if k in
                                            ("dims", "dtype", "lora", "batches", "steps")))
    lines += ["", "| variant | batch | status | gradients = no checkpointing | step-1 peak | steady peak | median step "
              "| offload line in step 1 |", "|---|---|---|---|---|---|---|---|"]
    for r in bench.get("rows", []):
        median = r.get("median_s")
        lines.append(f"| {r.get('variant')} | {r.get('batch', '–')} | {r.get('status')}"
                     + (f": {r.get('error')}" if r.get("error") else "")
                     + f" | {r.get('grads_equal', '–')} | {_mib(r.get('step1_peak'))} | {_mib(r.get('steady_peak'))} | "
                     + ("–" if median is None else f"{median:.3f} s") + f" | {r.get('offload_message_step1', '–')} |")
    lines += ["", "## Targets (reported, not asserted)", ""]
    if not found:
        lines.append("no ratio could be formed (variants missing or failed)")
    for name, t in found.items():
        value = "n/a (no CUDA memory figures)" if t["ratio"] is None else f"{t['ratio']:.3f}"
        lines.append(f"- {name}: {value} at batch {t['batch']} (target {t['target']})")
    return "\n".join(lines) + "\n"


def main(argv=None):
    out = (argv or sys.argv[1:])[0]
    env = _load(os.path.join(out, "environment.json"), {})
    tests = tests_summary(os.path.join(out, "gpu-tests.xml"))
    bench = _load(os.path.join(out, "bench.json"), {})
    found = targets(bench.get("rows", []))
    sanitizer = sanitizer_summary(os.path.join(out, "sanitizer.txt"))
    with open(os.path.join(out, "results.json"), "w") as handle:
        json.dump({"environment": env, "tests": tests, "bench": bench, "targets": found, "sanitizer": sanitizer},
                  handle, indent=1)
    text = markdown(env, tests, bench, found, sanitizer)
    with open(os.path.join(out, "report.md"), "w") as handle:
        handle.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
