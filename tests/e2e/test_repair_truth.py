"""Every "repaired" line is true: said only where the same run without hotfix is wrong, by the fix that mattered.

Issue 31's acceptance line.  The walk: the e2e cases on tiny models (tests/support/repair_walk.py), each a
step without checkpointing and one in a mode, every trainable gradient compared (hotfix's engine,
``check_model``, 1e-6 relative):

* Whisper, full fine-tuning, reentrant (the seed's crash) and non-reentrant (right upstream);
* Whisper + PEFT LoRA on q/v after ``enable_input_require_grads()``, reentrant, non-reentrant and with no
  checkpointing at all (the hook's leaf is not changed in place);
* GIT with q/v training after ``enable_input_require_grads()`` (``embeddings += positions`` on the hook's
  leaf: upstream crashes in the step without checkpointing already), reentrant;
* Llava + LoRA on every q/v of both towers after ``enable_input_require_grads()`` (issue 31's case);
* on transformers 5.23.0 (.matrix): Whisper full and + LoRA, Llava + LoRA, reentrant (right upstream
  there), and GIT non-reentrant.

Each case runs with hotfix (one interpreter per case where a line is expected: each fix speaks once per
process; the cases expected right upstream share one per release) and with ``HOTFIX_DISABLE=1``.  Where the
run without hotfix is equal to no checkpointing, the run with it prints no "repaired" line.  Where it
crashes or is wrong, the run with hotfix is equal and its lines name exactly the fixes written down for
the case, and each of them matters: opted out alone (``HOTFIX_DISABLED_PATCHES``), the case is no longer
equal.  The walks without hotfix are recorded (tests/evidence/repair-truth.json, support/evidence.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version as installed

from conftest import SUPPORT, TRANSFORMERS_WARM, json_lines, matrix_path, repair_notices, run_python
from support import evidence

LEAF = "transformers-input-grads-leaf"
LAYER_IO = "transformers-checkpoint-layer-io"
FROZEN = "transformers-frozen-inputs"
FIXES = (LEAF, LAYER_IO, FROZEN, "unsloth-zoo-closure-tensors", "unsloth-zoo-offload-backward")

#: (transformers, case, mode) -> the fixes whose "repaired" line the run with hotfix prints (empty: right upstream)
CASES = {
    ("4.56.2", "whisper", "reentrant"): {LAYER_IO},
    ("4.56.2", "whisper", "non-reentrant"): set(),
    ("4.56.2", "whisper-lora", "reentrant"): {FROZEN, LAYER_IO},  # the anchored encoder's output reaches the decoder by keyword
    ("4.56.2", "whisper-lora", "non-reentrant"): set(),
    ("4.56.2", "whisper-lora", "none"): set(),
    ("4.56.2", "git-qv", "reentrant"): {LEAF},
    ("4.56.2", "llava-lora", "reentrant"): {FROZEN},
    ("5.23.0", "whisper", "reentrant"): set(),
    ("5.23.0", "whisper-lora", "reentrant"): set(),
    ("5.23.0", "llava-lora", "reentrant"): set(),
    ("5.23.0", "git-qv", "non-reentrant"): {LEAF},
}


def _walk(version, items, env=None):
    """Run ``items`` ((case, mode), ...) in one child; its results by (case, mode) and its "repaired" lines."""
    proc = run_python([str(SUPPORT / "repair_walk.py"), *(f"{case}:{mode}" for case, mode in items)],
                      env=dict({"OMP_NUM_THREADS": "1"}, **(env or {})),
                      pythonpath=[matrix_path("transformers", version)], timeout=600, warm=TRANSFORMERS_WARM)
    results = {(r["case"], r["mode"]): r for r in json_lines(proc.stdout)}
    assert sorted(results) == sorted(items), proc.stderr[-3000:]
    return results, repair_notices(proc.stderr)


#: what an upstream walk is made of (support/evidence.py adds the lab's infrastructure and the comparison rule)
GUARDS = ("tests/support/repair_walk.py", "tests/e2e/test_repair_truth.py")


def _upstream(version, items):
    """The walk of ``items`` without hotfix, recorded (tests/evidence/repair-truth.json): each case's status, and
    the "repaired" lines said (none); as ``_walk`` returns it."""
    def measure():
        results, lines = _walk(version, items, {"HOTFIX_DISABLE": "1"})
        return {"statuses": {f"{case}:{mode}": row["status"] for (case, mode), row in results.items()}, "lines": lines}

    parts = {"transformers": version, "items": [f"{case}:{mode}" for case, mode in items], "torch": installed("torch")}
    value = evidence.upstream("repair-truth", version, parts, GUARDS, measure, lambda result: result)
    return ({tuple(item.split(":")): {"status": status} for item, status in value["statuses"].items()},
            value["lines"])


def _named(lines):
    return {fix for fix in FIXES for line in lines if f"; {fix}, " in line}


def test_repaired_is_said_only_where_upstream_is_wrong_and_names_the_fixes_that_mattered():
    jobs = []  # (label, release, cases, env): every child at once, two at a time
    for version in sorted({v for v, _, _ in CASES}):
        cases = [(c, m) for v, c, m in CASES if v == version]
        jobs.append((("upstream", version), version, cases, {"HOTFIX_DISABLE": "1"}))
        jobs.append((("hotfix", version), version, [(c, m) for c, m in cases if not CASES[(version, c, m)]], None))
        for fix in sorted({f for (v, _, _), fixes in CASES.items() if v == version for f in fixes}):
            jobs.append((("without", version, fix), version, [(c, m) for c, m in cases if fix in CASES[(version, c, m)]],
                         {"HOTFIX_DISABLED_PATCHES": fix}))
    jobs += [(("hotfix", key), key[0], [key[1:]], None) for key, fixes in CASES.items() if fixes]
    with ThreadPoolExecutor(2) as pool:
        runs = dict(zip([job[0] for job in jobs], pool.map(
            lambda job: _upstream(job[1], job[2]) if job[0][0] == "upstream" else _walk(*job[1:]), jobs)))

    problems = []
    for key, expected in CASES.items():
        version, item = key[0], key[1:]
        before = runs[("upstream", version)][0][item]
        results, lines = runs[("hotfix", key if expected else version)]
        result = results[item]
        if not expected:  # right upstream: nothing said (by this case nor the others sharing its interpreter)
            if before["status"] != "equal" or result["status"] != "equal" or lines:
                problems.append(f"{key}: {before['status']} without hotfix, {result['status']} with it, lines {lines}")
            continue
        if before["status"] == "equal" or result["status"] != "equal":
            problems.append(f"{key}: {before['status']} without hotfix, {result['status']} with it")
        if _named(lines) != expected:
            problems.append(f"{key}: lines name {sorted(_named(lines))}, expected {sorted(expected)}: {lines}")
        for fix in expected:
            if runs[("without", version, fix)][0][item]["status"] == "equal":
                problems.append(f"{key}: {fix} says 'repaired', but the case is equal with it opted out")
    assert not problems, "\n".join(problems)
    # the walk has both kinds of case: right upstream (nothing said) and wrong or crashing upstream
    statuses = {r["status"] for label, (results, _) in runs.items() if label[0] == "upstream" for r in results.values()}
    assert statuses >= {"equal", "crash", "wrong"}, statuses
