"""``hotfix doctor``: reproduce the Whisper checkpointing bug here, with and without hotfix.

Each run happens in a fresh interpreter (``python -m hotfix.diagnostics.doctor --child``)
so the unpatched run is really unpatched: it gets ``HOTFIX_DISABLE=1``, which
stops both ``import hotfix`` and the ``.pth`` auto-activation.  The model is a
tiny random-weight Whisper built from a config: no download, a few seconds on
a CPU (``doctor_models.py``).  The children import from exactly the caller's
``sys.path`` (``children.module_with_this_path``: a relative ``PYTHONPATH`` made
absolute), and run in the system's temporary directory: a ``hotfix/`` folder in
the caller's working directory that the caller does not import (a source
checkout, say) must not shadow the installed package in them.  The check is :func:`hotfix.diagnostics.checker.check_model`
in its ``default`` mode: gradients of the checkpointed step compared with a step
without checkpointing on the same weights and batch.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Dict, List

from hotfix.diagnostics.children import child_env, json_lines, last_line, module_with_this_path, run_python
from hotfix.notice import REPAIR_NOTICE

# (case name, what it shows)
CASES = (
    ("whisper", "tiny Whisper, gradient_checkpointing_enable() with its defaults"),
    ("whisper-frozen-decoder-embeddings", "same, decoder embeddings frozen (silent gradient loss)"),
)


def run_case(case: str) -> Dict:
    """One case in this interpreter: the step without checkpointing, then with ``gradient_checkpointing_enable()``."""
    import torch
    import transformers

    from hotfix.diagnostics import doctor_models
    from hotfix.diagnostics.checker import check_model
    from hotfix.registry import registry

    result = {"case": case, "transformers": transformers.__version__, "torch": torch.__version__,
              "transformers_from": os.path.dirname(os.path.dirname(transformers.__file__)),
              "torch_from": os.path.dirname(os.path.dirname(torch.__file__)), "hotfix_active": registry.active}
    model, batch = doctor_models.BUILDERS[case]()
    # cut="raise": a loss cut off the graph fails in backward(), as in the user's training script.
    report = check_model(model, batch, modes=["default"], cut="raise", time_limit=300)
    step = report.modes[0]
    if report.reference.status != "reference":
        result.update(status="error", error=report.reference.error)
    elif step.grads is None:
        result.update(status="crash", error=step.error)
    else:
        result.update(status="trains" if step.ok else "wrong-gradients", loss=step.loss, summary=step.grads.summary(),
                      max_error=step.max_error, missing=len(step.missing), wrong=len(step.wrong))
    return result


def _child_main(cases: List[str]) -> int:
    # Running as `python -m hotfix.diagnostics.doctor` imported the hotfix package, which
    # activated it unless HOTFIX_DISABLE is set: exactly a user's `import hotfix`.
    for case in cases:
        print(json.dumps(run_case(case)), flush=True)
    return 0


def _run_child(disabled: bool) -> List[Dict]:
    proc = run_python(module_with_this_path("hotfix.diagnostics.doctor", "--child", *[c for c, _ in CASES]),
                      env=child_env(hotfix=not disabled), cwd=tempfile.gettempdir(), timeout=600)
    for line in proc.stderr.splitlines():
        # hotfix's problem lines matter here; its "repaired" notice is what the table shows anyway.
        if line.startswith("hotfix:") and not line.startswith(REPAIR_NOTICE):
            print(f"  [{'without' if disabled else 'with'} hotfix] {line}")
    results = json_lines(proc.stdout)
    if not results:
        results = [{"case": c, "status": "error", "error": last_line(proc)} for c, _ in CASES]
    return results


def _describe(result: Dict) -> str:
    status = result.get("status")
    if status == "crash":
        return f"CRASH   {result['error']}"
    if status == "error":
        return f"ERROR   {result['error']}"
    label = "TRAINS " if status == "trains" else "WRONG  "
    return f"{label} loss {result['loss']:.4f}; {result['summary']}"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return _child_main(argv[1:])
    try:
        import transformers  # noqa: F401  (only: can the children run at all?)
    except Exception as exc:
        print(f"hotfix doctor: transformers cannot be imported here ({exc!r}); nothing to check.")
        return 2
    from hotfix.registry import registry
    from hotfix.status import not_covered

    uncovered = not_covered(registry, distribution="transformers")  # the fixes of the Whisper cases' library
    if any(not fix.applies for fix in uncovered):  # e.g. transformers 4.34: no checkpoint function to act on
        print("hotfix doctor: nothing to compare here; hotfix's fixes do not reach this release:")
        for fix in uncovered:
            print(f"  {fix.name}: NOT COVERED: {fix.why}")
        print("Install a release the fixes reach (`hotfix status --verbose` lists the ranges).")
        return 2
    if uncovered:  # applied, but upstream drops some state before any checkpoint function sees it (5.5.1's Gemma-4)
        print("hotfix doctor: on this release hotfix cannot repair everything (the cases below do not show it):")
        for fix in uncovered:
            print(f"  {fix.name}: NOT COVERED: {fix.why}")
        print()
    print("hotfix doctor: tiny random-weight Whisper (2+2 layers, d_model 16) on CPU, one training step,")
    print("gradients compared with the same step without checkpointing.\n")
    without = _run_child(disabled=True)
    with_fix = _run_child(disabled=False)
    if without and "transformers" in without[0]:
        first = without[0]
        print(f"transformers {first['transformers']} (from {first.get('transformers_from', '?')}), torch {first['torch']} "
              f"(from {first.get('torch_from', '?')}): what this Python imports here\n")
    healthy = True
    for (case, what), before, after in zip(CASES, without, with_fix):
        print(f"{case}: {what}")
        print(f"  without hotfix (HOTFIX_DISABLE=1): {_describe(before)}")
        print(f"  with hotfix:                       {_describe(after)}")
        healthy = healthy and after.get("status") == "trains"
    broken_before = any(r.get("status") != "trains" for r in without)
    print()
    if healthy and broken_before:
        print("verdict: this environment has the bug, and hotfix fixes it.")
    elif healthy:
        print("verdict: checkpointing already works here without hotfix; hotfix changes nothing.")
    else:
        print("verdict: checkpointing is still broken with hotfix here; please report it with `hotfix status`.")
    if uncovered:
        print(f"NOT COVERED on this release (above): {', '.join(fix.name for fix in uncovered)}.")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
