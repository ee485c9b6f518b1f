"""Turn a GPU-kit part's files in OUT into results.json and report.md (ratios from one run).

    python -P -m hotfix_lab.gpu.report OUT

Reads whatever the part wrote: environment.json (tools/hotfix_lab/gpu/environment.py), gpu-tests.xml
(pytest's junit file), sanitizer.txt, bench.json (tools/hotfix_lab/gpu/bench.py), soak.jsonl
(tools/hotfix_lab/gpu/soak.py), compile.jsonl (tools/hotfix_lab/cases/compile_case.py), ddp/{upstream,hotfix}/rank0.json
(tools/hotfix_lab/cases/ddp_cases.py under torchrun, one GPU), wrapper/ and deepspeed/ (the same form: wrapper_cases.py,
deepspeed_cases.py on DeepSpeed 0.19.8), deepspeed-0.19.2/{upstream,hotfix}/rank0.json and log.txt
(deepspeed_cases.py on DeepSpeed 0.19.2), nonreentrant.jsonl (tools/hotfix_lab/gpu/nonreentrant.py),
fit.json (tools/hotfix_lab/gpu/fit.py), unsloth-tests.xml and unsloth-flow.jsonl (tests/versions/
test_unsloth_gpu.py, tools/hotfix_lab/gpu/unsloth_flow.py).
The targets are reported, never asserted:
  step-1 peak, hotfix + 2025.11.3 / upstream 2025.11.5 (the anchor shape)   target: within 2 %
  steady peak, hotfix / use_reentrant=False, largest common batch          target: <= 0.8
  median step time, hotfix / use_reentrant=False, same batch               target: <= 1.10
A ratio whose variants' gradients were not equal to the reference says so.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET

from hotfix_lab.gpu import nonreentrant  # (its verdict and peak ratios: the expectations live with the case)

HOTFIX_VARIANTS = ("hotfix+zoo-2025.11.3", "hotfix+zoo-2026.10.9")
#: (fixed, upstream) pairs whose step-1 peaks the goal compares: the anchor shape, then the main one
STEP1_PAIRS = (("anchor:hotfix+zoo-2025.11.3", "anchor:zoo-2025.11.5"), ("hotfix+zoo-2025.11.3", "zoo-2025.11.5"))
RACE_LINE = "CSAN detected a possible data race"
DDP_ERROR = "Expected to mark a variable ready only once"
#: hotfix_lab.cases.ddp_cases's cases that fail upstream with DDP_ERROR (docs/fixes/transformers-ddp-find-unused.md);
#: trainer-lora only where the Trainer wrapped the model in DDP: accelerate does on the CPU with one process, on
#: CUDA only with more than one (accelerate 1.15 MULTI_GPU), so on one GPU it is expected to train outside DDP
DDP_UPSTREAM_FAILS = ("lora", "full", "lora+unused", "lora+no_sync", "trainer-lora",
                      "direct:blocks", "direct:remote", "direct:moe")  # direct: torch-ddp-find-unused
#: upstream trains these: static_graph (DDP does not search); whisper-lora fails upstream first for another reason
#: (no layer input needs grad: transformers-frozen-inputs' mechanism), which the hotfix run repairs as well
DDP_UPSTREAM_OTHER = {"lora+static_graph": "ok, equal", "whisper-lora": "fails (not the DDP error)"}


def _load(path, default):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def _lines(path):
    try:
        with open(path) as handle:
            return [json.loads(line) for line in handle if line.startswith("{")]
    except (OSError, ValueError):
        return None


def tests_summary(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {"ran": False}
    cases = []
    for case in root.iter("testcase"):
        outcome, message = "passed", None
        for child in case:
            first = ((child.get("message") or "").strip().splitlines() or [""])[0][:300]
            if child.tag in ("failure", "error"):
                outcome, message = "failed", first
            elif child.tag == "skipped":
                outcome, message = "skipped", first
        cases.append({"name": case.get("name"), "outcome": outcome, "seconds": float(case.get("time", 0)),
                      "message": message})
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    return {"ran": True, **counts, "cases": cases}


def sanitizer_verdict(found):
    result = found["result"] or {}
    if found["races"]:
        return f"{found['races']} race(s) reported"
    if not result:
        return f"no result (exit status {found['exit_status']})"
    if result.get("status") != "ok":
        return f"{result.get('status')}: {result.get('error')}"
    if not result.get("offload_message_step1"):
        return "0 races, but the offload line did not print: nothing was offloaded, this proves nothing"
    return "0 races with the offload active from step 1"


def sanitizer_summary(path):
    """What CUDA's stream sanitizer said (scripts/gpu/run's sanitizer step): per release, races reported,
    exit status, the JSON result line and the verdict; None when the step did not run."""
    try:
        text = open(path).read()
    except OSError:
        return None
    releases = {}
    for block in text.split("## unsloth-zoo ")[1:]:
        version, _, body = block.partition("\n")
        rows = [json.loads(line) for line in body.splitlines() if line.startswith("{")]
        status = [line.split()[-1] for line in body.splitlines() if line.startswith("exit status")]
        found = {"races": body.count(RACE_LINE), "exit_status": int(status[-1]) if status else None,
                 "result": rows[0] if rows else None}
        found["verdict"] = sanitizer_verdict(found)
        releases[version.strip()] = found
    return releases


def _rank_runs(out, folder):
    """A torchrun case's two launches (``folder``/{upstream,hotfix}/rank0.json): (runs, problems, case names in
    order), runs None where neither ran."""
    runs = {run: _load(os.path.join(out, folder, run, "rank0.json"), None) for run in ("upstream", "hotfix")}
    if not any(runs.values()):
        return None, [], []
    problems = []
    for run, want in (("upstream", False), ("hotfix", True)):
        if runs[run] is None:
            problems.append(f"{run}: no result ({folder}/{run}/rank0.json missing: see extras-log.txt)")
        elif runs[run].get("hotfix_loaded") is not want:
            problems.append(f"{run}: hotfix_loaded {runs[run].get('hotfix_loaded')}, expected {want}")
    names = []
    for data in runs.values():
        names += [name for name in (data or {}).get("cases", {}) if name not in names]
    return runs, problems, names


def ddp_summary(out):
    """The 1-GPU DDP case: each case upstream and with hotfix against what docs/fixes/transformers-ddp-find-unused.md
    measured on CPU, and the verdict; None when the case did not run."""
    runs, problems, names = _rank_runs(out, "ddp")
    if runs is None:
        return None
    notes, rows = [], []
    for name in names:
        up, fixed = ((runs[run] or {}).get("cases", {}).get(name) for run in ("upstream", "hotfix"))
        rows.append({"case": name, "upstream": up, "hotfix": fixed})
        if name == "trainer-lora":
            for run, case in (("upstream", up), ("hotfix", fixed)):
                if case and case.get("ok") and case.get("wrapper") != "DistributedDataParallel":
                    notes.append(f"trainer-lora ({run}) ran outside DDP (wrapper {case.get('wrapper')}): "
                                 f"accelerate wraps one CUDA process in no DDP; it shows nothing about DDP here")
        if up is not None:
            outside_ddp = name == "trainer-lora" and up.get("ok") and up.get("wrapper") != "DistributedDataParallel"
            if name in DDP_UPSTREAM_FAILS and not outside_ddp and DDP_ERROR not in str(up.get("error")):
                problems.append(f"upstream {name}: {_case_text(up)}, expected \"{DDP_ERROR}\"")
            if name == "lora+static_graph" and not (up.get("ok") and up.get("equal")):
                problems.append(f"upstream {name}: {_case_text(up)}, expected ok and equal")
            if name == "whisper-lora" and (up.get("ok") or DDP_ERROR in str(up.get("error"))):
                problems.append(f"upstream {name}: {_case_text(up)}, expected another error first")
        if fixed is not None and not (fixed.get("ok") and fixed.get("equal")):
            problems.append(f"hotfix {name}: {_case_text(fixed)}, expected ok and every gradient equal")
    return {"rows": rows, "problems": problems, "notes": notes,
            "device": next((r.get("device") for r in runs.values() if r), None),
            "versions": next(({k: r.get(k) for k in ("torch", "transformers")} for r in runs.values() if r), {})}


def _pair_summary(out, folder, judge, versions=("torch", "transformers")):
    """A torchrun case's upstream / hotfix pair (``_rank_runs``), each case judged by ``judge(name, upstream, hotfix)``
    (its problems); the summary the report renders, or None when the case did not run."""
    runs, problems, names = _rank_runs(out, folder)
    if runs is None:
        return None
    rows = []
    for name in names:
        up, fixed = ((runs[run] or {}).get("cases", {}).get(name) for run in ("upstream", "hotfix"))
        rows.append({"case": name, "upstream": up, "hotfix": fixed})
        problems += judge(name, up, fixed)
    return {"rows": rows, "problems": problems, "notes": [],
            "device": next((r.get("device") for r in runs.values() if r), None),
            "versions": next(({k: r.get(k) for k in versions} for r in runs.values() if r), {})}


def wrapper_summary(out):
    """The 1-GPU FSDP / FSDP2 checkpoint_wrapper cases (hotfix_lab.cases.wrapper_cases): upstream wrong or failing, with
    hotfix every gradient equal (docs/fixes/torch-checkpoint-wrapper.md); None when the case did not run."""
    def judge(name, up, fixed):
        problems = []
        if up is not None and up.get("ok") and up.get("equal"):
            problems.append(f"upstream {name}: equal, expected wrong gradients or an error (the Cache written twice)")
        if fixed is not None and not (fixed.get("ok") and fixed.get("equal")):
            problems.append(f"hotfix {name}: {_case_text(fixed)}, expected ok and every gradient equal")
        return problems

    return _pair_summary(out, "wrapper", judge)


#: hotfix_lab.cases.deepspeed_cases's cases on one GPU: what upstream does (None: trains equal), as measured on CPU
#: (tests/e2e/test_deepspeed.py); with hotfix every case trains, gradients and parameters equal
DEEPSPEED_UPSTREAM = {"zero3:whisper:reentrant": "Trying to backward through the graph a second time",
                      "zero3:whisper-lora:reentrant": "loss must be a scalar tensor",
                      "zero3:lora:nonreentrant": None,
                      "trainer-zero3:whisper:reentrant": "Trying to backward through the graph a second time",
                      # DeepSpeed's own checkpoint function (deepspeed-checkpoint-layer-io; issue 42, part 4)
                      "zero3:whisper:deepspeed": "not enough values to unpack",
                      # with its partition_activations and cpu_checkpointing (the tuple of one fails first on 4.56.2)
                      "zero3:whisper:deepspeed-partitioned": "not enough values to unpack",
                      # cpu_checkpointing alone (issue 50; DeepSpeed's offload engine on CUDA; on the CPU, its blocking
                      # path with a stand-in host copy: docs/fixes/deepspeed-checkpoint-layer-io.md)
                      "zero3:whisper:deepspeed-cpu": "not enough values to unpack"}


#: the last DeepSpeed release before its own fix (0.19.3, deepspeedai/DeepSpeed#8148) of ZeRO-3 + non-reentrant
#: checkpointing with frozen parameters, and its cases on one GPU (scripts/gpu/run's ds192_cases): what upstream does
#: (None: trains equal), as measured on CPU (tests/e2e/test_deepspeed.py, 2 ranks; the kit's 3 cases with 1 rank by
#: hand, 2026-11-28); with hotfix every case trains, gradients and parameters equal, and the hotfix run says it
#: repaired with DEEPSPEED_FIX (docs/fixes/deepspeed-zero3-frozen-recompute.md)
DEEPSPEED_BEFORE_FIX = "0.19.2"
FROZEN_PARAMETER_ERROR = "Recomputed values for the following tensors have different metadata"
DEEPSPEED_BEFORE_FIX_UPSTREAM = {"zero3:lora:nonreentrant": FROZEN_PARAMETER_ERROR,
                                 "zero3:whisper-lora:nonreentrant": FROZEN_PARAMETER_ERROR,
                                 "zero3:lora:reentrant": None}  # reentrant: the workaround before the fix
DEEPSPEED_FIX = "deepspeed-zero3-frozen-recompute"
REPAIRED = "hotfix: repaired"


def deepspeed_summary(out, folder="deepspeed", expected_upstream=None, release="0.19.8"):
    """The 1-GPU DeepSpeed ZeRO-3 cases in ``folder`` against ``expected_upstream`` (DEEPSPEED_UPSTREAM by default),
    hotfix's equality and the DeepSpeed ``release`` each run reports; None when they did not run."""
    expected_upstream = DEEPSPEED_UPSTREAM if expected_upstream is None else expected_upstream

    def judge(name, up, fixed):
        problems, expected = [], expected_upstream.get(name)
        if up is not None and expected is None and not (up.get("ok") and up.get("equal")):
            problems.append(f"upstream {name}: {_case_text(up)}, expected ok and equal")
        if up is not None and expected is not None and expected not in str(up.get("error")):
            problems.append(f"upstream {name}: {_case_text(up)}, expected \"{expected}\"")
        if fixed is not None and not (fixed.get("ok") and fixed.get("equal") and fixed.get("params_equal")):
            problems.append(f"hotfix {name}: {_case_text(fixed)}, expected ok, every gradient and parameter equal")
        return problems

    found = _pair_summary(out, folder, judge, ("torch", "transformers", "deepspeed"))
    if found is None:
        return None
    for run in ("upstream", "hotfix"):
        data = _load(os.path.join(out, folder, run, "rank0.json"), None)
        if data is not None and data.get("deepspeed") != release:
            found["problems"].append(f"{run}: DeepSpeed {data.get('deepspeed')}, expected {release} "
                                     f"(the wrong release on PYTHONPATH: the cases show nothing about {release})")
    found["release"] = release
    return found


def deepspeed_before_fix_summary(out):
    """The 1-GPU ZeRO-3 cases on DeepSpeed 0.19.2 (``deepspeed-0.19.2/``): upstream as DEEPSPEED_BEFORE_FIX_UPSTREAM,
    with hotfix every case equal, and the launches' logs (log.txt beside rank0.json): the hotfix run's "repaired"
    line names DEEPSPEED_FIX, upstream's says no repair; None when they did not run."""
    folder = f"deepspeed-{DEEPSPEED_BEFORE_FIX}"
    found = deepspeed_summary(out, folder, DEEPSPEED_BEFORE_FIX_UPSTREAM, DEEPSPEED_BEFORE_FIX)
    if found is None:
        return None
    for run, want in (("upstream", False), ("hotfix", True)):
        try:
            said = [line for line in open(os.path.join(out, folder, run, "log.txt"), errors="replace")
                    if line.startswith(REPAIRED)]
        except OSError:
            found["notes"].append(f"{run}: no log.txt, the repaired lines not checked")
            continue
        named = any(DEEPSPEED_FIX in line for line in said)
        if want and not named:
            found["problems"].append(f"hotfix: no \"{REPAIRED} ...{DEEPSPEED_FIX}\" line in {folder}/hotfix/log.txt "
                                     f"(the fix did not repair these cases, or its line was silenced)")
        if not want and said:
            found["problems"].append(f"upstream: hotfix said it repaired (HOTFIX_DISABLE=1 not honoured): "
                                     f"{said[0][:200]}")
    return found


def moe_summary(out):
    """hotfix_lab.cases.moe_cases in bf16 on the device (scripts/gpu/run's extras): per transformers line and case,
    upstream and hotfix; a problem where hotfix is not equal (a case that could not be built: n/a both ways).
    Without the drift device upstream may well be equal (the kernels' own drift rarely flips a tiny model's ties)."""
    folder = os.path.join(out, "moe")
    if not os.path.isdir(folder):
        return None
    rows, problems = [], []
    # "zoo": unsloth-zoo's fused router with its Triton kernel (hotfix_lab.cases.zoo_moe; runs before 2026-11-30 lack it)
    for line in ("4", "5", "zoo"):
        runs = {side: {r["case"]: r for r in _lines(os.path.join(folder, f"{line}-{side}.jsonl")) or []}
                for side in ("upstream", "hotfix")}
        if line == "zoo" and not (runs["upstream"] or runs["hotfix"]):
            continue
        for case in dict.fromkeys(list(runs["upstream"]) + list(runs["hotfix"])):
            up, fixed = runs["upstream"].get(case), runs["hotfix"].get(case)
            if case == "callers":  # zoo_moe.py's last line: which of the release's modules were told to route eagerly
                continue
            transformers = (fixed or up or {}).get("transformers")
            label = case if line != "zoo" else f"{case} (unsloth-zoo's fused router)"
            rows.append({"transformers": transformers, "case": label, "upstream": up, "hotfix": fixed})
            if fixed is None or (fixed.get("status") not in ("equal", "n/a")):
                problems.append(f"transformers {transformers} {label}: with hotfix "
                                f"{(fixed or {}).get('status', 'no result')}")
            elif "nodrift" not in case and up is not None and up.get("status") == "equal":
                problems.append(f"transformers {transformers} {label}: the drift device flipped no token upstream")
            if line == "zoo" and fixed is not None and fixed.get("status") == "equal":
                if (up or {}).get("kernel_recomputations", 0) < 1:
                    problems.append(f"transformers {transformers} {label}: upstream the kernel chose in no "
                                    f"recomputation (the case proved nothing)")
                if fixed.get("kernel_recomputations") != 0:
                    problems.append(f"transformers {transformers} {label}: with hotfix the kernel chose in "
                                    f"{fixed.get('kernel_recomputations')} recomputation(s)")
    return {"rows": rows, "problems": problems}


def pinned_summary(out):
    """unsloth's offload with every pinned host allocation refused (scripts/gpu/run's extras, unsloth-zoo 2025.11.3):
    upstream its set-up raises "out of memory"; with hotfix (unsloth-zoo-pinned-memory and the offload pool's own
    fallback) two steps with every gradient equal to no checkpointing and the offload line in step 1.  None: not run."""
    folder = os.path.join(out, "pinned")
    if not os.path.isdir(folder):
        return None
    runs = {side: (_lines(os.path.join(folder, f"{side}.jsonl")) or [None])[-1] for side in ("upstream", "hotfix")}
    problems = []
    up, fixed = runs["upstream"], runs["hotfix"]
    if not up or up.get("status") != "crash" or "out of memory" not in up.get("error", ""):
        problems.append(f"upstream: expected its set-up to raise 'out of memory', got {_pinned_text(up)}")
    if not fixed or fixed.get("status") != "ok" or not fixed.get("grads_equal") or not all(fixed["grads_equal"]):
        problems.append(f"with hotfix: expected every step's gradients equal, got {_pinned_text(fixed)}")
    elif not fixed.get("offload_message_step1"):   # no offload, no pageable buffers used: equal proves nothing
        problems.append("with hotfix: no offload line in step 1: the pageable buffers were never used")
    return {"upstream": up, "hotfix": fixed, "problems": problems}


def _pinned_text(row):
    if not row:
        return "no result"
    if row.get("status") != "ok":
        return f"{row.get('status')}: {row.get('error')}"
    return f"ok, gradients equal per step {row.get('grads_equal')} (max rel. {row.get('max_rel_error')})"


def _pinned_markdown(pinned):
    lines = ["", "## unsloth's offload with pinned host memory refused (unsloth-zoo 2025.11.3, --refuse-pinned)", ""]
    lines += [f"- upstream: {_pinned_text(pinned['upstream'])}", f"- hotfix: {_pinned_text(pinned['hotfix'])}"]
    return lines + _verdict_lines(pinned["problems"])


def _case_text(case):
    if case is None:
        return "–"
    if not case.get("ok"):
        return f"fails: {case.get('error')}"
    return f"ok, {case.get('summary')}"


def nonreentrant_summary(path):
    """hotfix_lab.gpu.nonreentrant's rows, its verdict (recomputed from the rows) and the peak ratios; None: not run."""
    lines = _lines(path)
    if lines is None:
        return None
    rows = [line for line in lines if "variant" in line]
    return {"rows": rows, "problems": nonreentrant.verdict(rows), "ratios": nonreentrant.peak_ratios(rows)}


def unsloth_summary(out):
    """The seed's FastModel flow: its GPU test's outcome and the flow's rows; None when the part did not run."""
    tests = tests_summary(os.path.join(out, "unsloth-tests.xml"))
    lines = _lines(os.path.join(out, "unsloth-flow.jsonl")) or []
    if not tests.get("ran") and not lines:
        return None
    verdicts = [line for line in lines if "verdict" in line]
    return {"tests": tests, "rows": [line for line in lines if "variant" in line],
            "verdict": verdicts[-1] if verdicts else None}


def _ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def _ok(rows, variant):
    return {r["batch"]: r for r in rows if r.get("variant") == variant and r.get("status") == "ok"}


def _gradients(rows, variant):
    """True / False: the variant's compared batch had every gradient equal; None: not compared."""
    compared = [r for r in rows if r.get("variant") == variant and "grads_equal" in r]
    return all(all(r["grads_equal"]) for r in compared) if compared else None


def _target(rows, mine, theirs, batch, key, target):
    found = {"batch": batch, "ratio": _ratio(_ok(rows, mine)[batch][key], _ok(rows, theirs)[batch][key]),
             "target": target}
    unequal = [v for v in (mine, theirs) if _gradients(rows, v) is False]
    if unequal:
        found["note"] = "gradients not equal to the reference in " + ", ".join(unequal)
    return found


def targets(rows):
    out = {}
    for fixed, upstream in STEP1_PAIRS:
        common = sorted(set(_ok(rows, fixed)) & set(_ok(rows, upstream)))
        for b in sorted({common[0], common[-1]}) if common else ():
            out[f"step1_peak_{fixed}_over_{upstream}_b{b}"] = _target(rows, fixed, upstream, b, "step1_peak",
                                                                      "within 2 % of 1.0")
    for reference in ("non-reentrant", "hf-offload"):
        for variant in HOTFIX_VARIANTS:
            shared = sorted(set(_ok(rows, variant)) & set(_ok(rows, reference)))
            if not shared:
                continue
            b = shared[-1]
            goal = reference == "non-reentrant"
            out[f"steady_peak_{variant}_over_{reference}"] = _target(rows, variant, reference, b, "steady_peak",
                                                                    "<= 0.8" if goal else "none (comparison)")
            out[f"step_time_{variant}_over_{reference}"] = _target(rows, variant, reference, b, "median_s",
                                                                  "<= 1.10" if goal else "none (comparison)")
    return out


def soak_summary(rows):
    """Each soak run with its loss curve set beside the non-reentrant run's (largest step-wise difference)."""
    if rows is None:
        return None
    workaround = next((r for r in rows if r.get("mode") == "non-reentrant" and r.get("status") == "ok"), None)
    out = []
    for r in rows:
        found = {k: r.get(k) for k in ("mode", "zoo", "hotfix", "status", "error", "batch", "first_loss", "last_loss",
                                       "peak_max", "peak_spread", "allocated_growth", "rss_growth", "median_s")}
        found["steps"] = len(r.get("steps", []))
        if workaround and r is not workaround and r.get("status") == "ok":
            pairs = list(zip(r["steps"], workaround["steps"]))
            found["max_loss_difference_vs_non_reentrant"] = max(abs(a["loss"] - b["loss"]) for a, b in pairs)
        out.append(found)
    return out


def _mib(value):
    return "–" if value is None else f"{value / 2**20:,.0f} MiB"


def _mib_of(value):
    """A figure already in MiB (unsloth_flow.py's rows)."""
    return "–" if value is None else f"{value:,.1f} MiB"


def _label(run):
    return f"{run.get('mode')}{' ' + run['zoo'] if run.get('zoo') else ''} ({'hotfix' if run.get('hotfix') else 'upstream'})"


def markdown(env, tests, bench, found, sanitizer=None, soak=None, compiled=None, fit=None, ddp=None, routing=None,
             unsloth=None, wrapper=None, deepspeed=None, deepspeed_before_fix=None, moe=None, pinned=None):
    lines = ["# GPU kit results", ""]
    lines += [f"- {k}: {v}" for k, v in env.items() if k != "installed"]
    for folder, versions in env.get("installed", {}).items():
        lines.append(f"- installed {folder}: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if tests.get("ran"):
        lines += ["", "## GPU tests", ""]
        lines.append(f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped")
        lines += [f"- {c['outcome']}: {c['name']} ({c['seconds']:.1f} s)"
                  + (f": {c['message']}" if c["outcome"] != "passed" and c.get("message") else "") for c in tests["cases"]]
    if sanitizer is not None:
        lines += ["", "## CUDA stream sanitizer (TORCH_CUDA_SANITIZER=1) over hotfix's offloader, batch 4", ""]
        lines += ["not run"] if not sanitizer else []
        for version, f in sanitizer.items():
            result = f["result"] or {}
            lines.append(f"- unsloth-zoo {version}: {f['verdict']}; exit status {f['exit_status']}, offload line in "
                         f"step 1 {result.get('offload_message_step1', '–')}, gradients equal "
                         f"{result.get('grads_equal', '–')} (max rel. {result.get('max_rel_error', '–')}, "
                         f"bound {result.get('bound', '–')})")
    if bench:
        lines += ["", "## Benchmark", ""]
        settings = bench.get("settings", {})
        lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items() if k in
                                                ("dims", "dtype", "lora", "batches", "steps", "budget")))
        lines += ["", "| variant | batch | status | gradients = no checkpointing (max rel. / bound) | step-1 peak "
                  "| steady peak | median step | offload line in step 1 |", "|---|---|---|---|---|---|---|---|"]
        for r in bench.get("rows", []):
            median = r.get("median_s")
            grads = "–" if "grads_equal" not in r else (
                f"{r['grads_equal']} ({r.get('max_rel_error', 0):.2g} / "
                + ("–" if r.get("bound") is None else f"{r['bound']:.2g}")
                + (f", {r['missing_grads']} missing" if r.get("missing_grads") else "") + ")")
            lines.append(f"| {r.get('variant')} | {r.get('batch', '–')} | {r.get('status')}"
                         + (f": {r.get('error')}" if r.get("error") else "")
                         + f" | {grads} | {_mib(r.get('step1_peak'))} | {_mib(r.get('steady_peak'))} | "
                         + ("–" if median is None else f"{median:.3f} s") + f" | {r.get('offload_message_step1', '–')} |")
        lines += ["", "## Targets (reported, not asserted)", ""]
        if not found:
            lines.append("no ratio could be formed (variants missing or failed)")
        for name, t in found.items():
            value = "n/a (no CUDA memory figures)" if t["ratio"] is None else f"{t['ratio']:.3f}"
            lines.append(f"- {name}: {value} at batch {t['batch']} (target {t['target']})"
                         + (f"; {t['note']}" if t.get("note") else ""))
    if soak is not None:
        lines += ["", "## Soak (real optimizer steps)", "", "| run | status | steps | loss first → last | max |Δ loss| "
                  "vs non-reentrant | peak (max, spread) | allocated growth | host RSS growth | median step |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for s in soak:
            loss = "–" if s["first_loss"] is None else f"{s['first_loss']:.4f} → {s['last_loss']:.4f}"
            diff = s.get("max_loss_difference_vs_non_reentrant")
            lines.append(f"| {_label(s)} | {s['status']}" + (f": {s['error']}" if s.get("error") else "")
                         + f" | {s['steps']} | {loss} | {'–' if diff is None else f'{diff:.4g}'} | "
                         f"{_mib(s['peak_max'])}, {_mib(s['peak_spread'])} | {_mib(s['allocated_growth'])} | "
                         f"{_mib(s['rss_growth'])} | " + ("–" if s["median_s"] is None else f"{s['median_s']:.3f} s") + " |")
    if compiled is not None:
        lines += ["", "## torch.compile over a checkpointed model (tools/hotfix_lab/cases/compile_case.py)", "",
                  "| model | function | backend | hotfix | status | missing | max rel. | graphs / breaks / recompiles |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in compiled:
            lines.append(f"| {c.get('model')} | {c.get('function')} | {c.get('backend')} | {c.get('hotfix')} | "
                         f"{c.get('status')}" + (f": {c.get('error')}" if c.get("error") else "")
                         + f" | {c.get('missing', '–')} | {c.get('max_rel', '–')} | "
                         f"{c.get('graphs', '–')} / {c.get('breaks', '–')} / {c.get('recompiles', '–')} |")
    if ddp is not None:
        lines += _ddp_markdown(ddp)
    if wrapper is not None:
        lines += _wrapper_markdown(wrapper)
    if deepspeed is not None:
        lines += _deepspeed_markdown(deepspeed)
    if moe is not None:
        lines += _moe_markdown(moe)
    if pinned is not None:
        lines += _pinned_markdown(pinned)
    if deepspeed_before_fix is not None:
        lines += _deepspeed_markdown(
            deepspeed_before_fix, f"DeepSpeed {DEEPSPEED_BEFORE_FIX} ZeRO-3 (before its own fix), frozen parameters, "
            f"one GPU (tools/hotfix_lab/cases/deepspeed_cases.py; {DEEPSPEED_FIX})", DEEPSPEED_BEFORE_FIX_UPSTREAM)
    if routing is not None:
        lines += _routing_markdown(routing)
    if unsloth is not None:
        lines += _unsloth_markdown(unsloth)
    if fit:
        lines += ["", "## Largest batch (one step per probe)", ""]
        lines += [f"- {r['variant']}: {r.get('verdict') or r.get('status')}" + (f" ({r['seconds']} s)" if "seconds" in r else "")
                  for r in fit.get("rows", [])]
    return "\n".join(lines) + "\n"


def _verdict_lines(problems, notes=()):
    lines = ["", "verdict: " + ("as expected" if not problems else f"NOT as expected ({len(problems)})")]
    lines += [f"- {problem}" for problem in problems]
    lines += [f"- note: {note}" for note in notes]
    return lines


def _ddp_markdown(ddp):
    lines = ["", "## DDP, find_unused_parameters=True, reentrant checkpointing, one GPU (tools/hotfix_lab/cases/ddp_cases.py)", "",
             f"device {ddp['device']}, " + ", ".join(f"{k} {v}" for k, v in ddp["versions"].items()), "",
             "| case | upstream | hotfix | upstream expected |", "|---|---|---|---|"]
    for row in ddp["rows"]:
        expected = DDP_UPSTREAM_OTHER.get(row["case"], f'fails: "{DDP_ERROR}"' if row["case"] in DDP_UPSTREAM_FAILS
                                          else "–")
        lines.append(f"| {row['case']} | {_case_text(row['upstream'])} | {_case_text(row['hotfix'])} | {expected} |")
    return lines + _verdict_lines(ddp["problems"], ddp["notes"])


def _wrapper_markdown(wrapper):
    lines = ["", "## FSDP / FSDP2 activation checkpointing (torch's checkpoint_wrapper), one GPU "
             "(tools/hotfix_lab/cases/wrapper_cases.py)", "",
             f"device {wrapper['device']}, " + ", ".join(f"{k} {v}" for k, v in wrapper["versions"].items()), "",
             "| case | upstream | hotfix |", "|---|---|---|"]
    for row in wrapper["rows"]:
        lines.append(f"| {row['case']} | {_case_text(row['upstream'])} | {_case_text(row['hotfix'])} |")
    return lines + _verdict_lines(wrapper["problems"], wrapper["notes"])


def _deepspeed_markdown(deepspeed, title="DeepSpeed ZeRO-3, one GPU (tools/hotfix_lab/cases/deepspeed_cases.py)",
                        expected_upstream=None):
    expected_upstream = DEEPSPEED_UPSTREAM if expected_upstream is None else expected_upstream
    lines = ["", f"## {title}", "",
             f"device {deepspeed['device']}, " + ", ".join(f"{k} {v}" for k, v in deepspeed["versions"].items()), "",
             "| case | upstream | hotfix | upstream expected |", "|---|---|---|---|"]
    for row in deepspeed["rows"]:
        expected = expected_upstream.get(row["case"])
        lines.append(f"| {row['case']} | {_case_text(row['upstream'])} | {_case_text(row['hotfix'])} | "
                     f"{'ok, equal' if expected is None else 'fails: ' + expected} |")
    return lines + _verdict_lines(deepspeed["problems"], deepspeed["notes"])


def _routing_markdown(routing):
    lines = ["", "## unsloth's offload under the non-reentrant default (tools/hotfix_lab/gpu/nonreentrant.py)", "",
             "| release | variant | status | unsloth nodes per layer, per step | offload line in step 1 | step-1 peak | "
             "steady peak | no checkpointing | gradients (max rel. / bound) | hotfix lines |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in routing["rows"]:
        steps = r.get("steps") or []
        grads = "–" if not steps else (
            f"{all(s['grads_equal'] for s in steps)} ({max(s['max_rel_error'] for s in steps):.2g} / {r['bound']:.2g}"
            + (f", {max(s['missing'] for s in steps)} missing" if any(s["missing"] for s in steps) else "") + ")")
        lines.append(f"| {r.get('release')} | {r.get('variant')} | {r.get('status')}"
                     + (f": {r.get('error')}" if r.get("error") else "")
                     + f" | {[s['unsloth_nodes_per_layer'] for s in steps] or '–'} | "
                     f"{r.get('offload_line_step1', '–')} | "
                     f"{_mib(r.get('step1_peak'))} | {_mib(r.get('steady_peak'))} | {_mib(r.get('reference_peak'))} | "
                     f"{grads} | {len(r.get('hotfix_lines') or [])} |")
    lines += ["", "Steady-state peak ratios (hotfix's routed call over upstream's bypassed one, and over upstream "
              "forced to use_reentrant=True):", ""]
    lines += [f"- {name}: " + ("n/a (no CUDA memory figures)" if value is None else f"{value:.3f}")
              for name, value in routing["ratios"].items()]
    return lines + _verdict_lines(routing["problems"])


def _moe_markdown(moe):
    lines = ["", "## MoE routing replay, bf16 on the device (tools/hotfix_lab/cases/moe_cases.py)", ""]
    if not moe["rows"]:
        return lines + ["not run"]
    lines += ["| transformers | case | upstream | hotfix |", "|---|---|---|---|"]
    for row in moe["rows"]:
        cells = [(r or {}).get("summary") or (r or {}).get("error") or (r or {}).get("status", "no result")
                 for r in (row["upstream"], row["hotfix"])]
        lines.append(f"| {row['transformers']} | {row['case']} | {cells[0]} | {cells[1]} |")
    return lines + _verdict_lines(moe["problems"])


def _unsloth_markdown(unsloth):
    tests = unsloth["tests"]
    lines = ["", "## The seed's FastModel flow (tests/versions/test_unsloth_gpu.py, tools/hotfix_lab/gpu/unsloth_flow.py)", ""]
    if tests.get("ran"):
        lines += [f"- {c['outcome']}: {c['name']} ({c['seconds']:.1f} s)"
                  + (f": {c['message']}" if c["outcome"] != "passed" and c.get("message") else "") for c in tests["cases"]]
    if unsloth["rows"]:
        lines += ["", "| variant | status | gradients per step | max rel. error | dropped | offload line in step 1 | "
                  "step-1 peak | steady peak | no checkpointing | stand-ins |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in unsloth["rows"]:
            errors = r.get("max_rel_error") or []
            status = f"{r.get('status')}" + (f": {r.get('error')}" if r.get("error") else "")
            lines.append(f"| {r.get('variant')} | {status} | {r.get('grads_equal', '–')} | "
                         f"{f'{max(errors):.2g}' if errors else '–'} | {r.get('grads_dropped', '–')} | "
                         f"{r.get('offload_line_step1', '–')} | {_mib_of(r.get('step1_peak_mib'))} | "
                         f"{_mib_of(r.get('steady_peak_mib'))} | {_mib_of(r.get('reference_peak_mib'))} | "
                         f"{', '.join(r.get('standins_imported') or []) or '–'} |")
    verdict = unsloth.get("verdict")
    if verdict:
        lines += _verdict_lines(verdict.get("problems", []))
    return lines


def main(argv=None):
    out = (argv or sys.argv[1:])[0]
    env = _load(os.path.join(out, "environment.json"), {})
    tests = tests_summary(os.path.join(out, "gpu-tests.xml"))
    bench = _load(os.path.join(out, "bench.json"), {})
    found = targets(bench.get("rows", []))
    sanitizer = sanitizer_summary(os.path.join(out, "sanitizer.txt"))
    soak = soak_summary(_lines(os.path.join(out, "soak.jsonl")))
    compiled = _lines(os.path.join(out, "compile.jsonl"))
    fit = _load(os.path.join(out, "fit.json"), {})
    ddp = ddp_summary(out)
    wrapper = wrapper_summary(out)
    deepspeed = deepspeed_summary(out)
    deepspeed_before_fix = deepspeed_before_fix_summary(out)
    routing = nonreentrant_summary(os.path.join(out, "nonreentrant.jsonl"))
    unsloth = unsloth_summary(out)
    moe = moe_summary(out)
    pinned = pinned_summary(out)
    with open(os.path.join(out, "results.json"), "w") as handle:
        json.dump({"environment": env, "tests": tests, "bench": bench, "targets": found, "sanitizer": sanitizer,
                   "soak": soak, "compile": compiled, "fit": fit, "ddp": ddp, "nonreentrant": routing,
                   "unsloth": unsloth, "wrapper": wrapper, "deepspeed": deepspeed,
                   "deepspeed_before_fix": deepspeed_before_fix, "moe": moe, "pinned": pinned}, handle, indent=1)
    text = markdown(env, tests, bench, found, sanitizer, soak, compiled, fit, ddp, routing, unsloth, wrapper, deepspeed,
                    deepspeed_before_fix, moe, pinned)
    with open(os.path.join(out, "report.md"), "w") as handle:
        handle.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
