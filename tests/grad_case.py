"""Run gradient-equivalence cases in this interpreter; one JSON line per case.

    python grad_case.py [--default-checkpointing] CASE [CASE ...]

For each case (see tiny_models.BUILDERS): one step without checkpointing,
then one with checkpointing (explicit ``use_reentrant=True`` unless
``--default-checkpointing``), and every parameter gradient compared with
hotfix.gradcheck.  A memory guard ends the process with a JSON line instead of
letting a runaway backward (WavLM unpatched) eat the machine.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

RSS_LIMIT_BYTES = int(os.environ.get("GRAD_CASE_RSS_LIMIT", 3 * 2**30))
TIME_LIMIT_S = float(os.environ.get("GRAD_CASE_TIME_LIMIT", 120))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _guard(state):
    while True:
        time.sleep(0.05)
        case, started = state.get("case"), state.get("started")
        reason = None
        if _rss_bytes() > RSS_LIMIT_BYTES:
            reason = f"memory-guard: RSS above {RSS_LIMIT_BYTES >> 20} MiB"
        elif started and time.monotonic() - started > TIME_LIMIT_S:
            reason = f"time-guard: over {TIME_LIMIT_S:.0f} s"
        if reason:
            print(json.dumps({"case": case, "status": "guard", "error": reason}), flush=True)
            os._exit(3)


def enable_checkpointing(model, reentrant):
    if hasattr(model, "gradient_checkpointing_enable"):
        if reentrant is None:
            model.gradient_checkpointing_enable()
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    else:
        model.enable(use_reentrant=True if reentrant is None else reentrant)


def step(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return float(loss)


def run(case, reentrant):
    import torch
    import transformers

    import tiny_models
    from hotfix.gradcheck import collect_grads, compare_grads

    result = {"case": case, "transformers": transformers.__version__}
    try:
        model, batch = tiny_models.BUILDERS[case]()
    except ImportError as exc:
        result.update(status="n/a", error=repr(exc))
        return result
    step(model, batch)
    reference = collect_grads(model)
    enable_checkpointing(model, reentrant)
    try:
        result["loss"] = step(model, batch)
    except Exception as exc:
        result.update(status="crash", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return result
    report = compare_grads(reference, collect_grads(model), rtol=1e-6)
    result.update(status="equal" if report.ok else "differs", summary=report.summary(),
                  missing=len(report.missing), wrong=len(report.wrong), total=report.total,
                  max_error=report.max_error)
    return result


def main(argv):
    reentrant = True
    if argv and argv[0] == "--default-checkpointing":
        reentrant, argv = None, argv[1:]
    state = {}
    threading.Thread(target=_guard, args=(state,), daemon=True).start()
    for case in argv:
        state.update(case=case, started=time.monotonic())
        print(json.dumps(run(case, reentrant)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
