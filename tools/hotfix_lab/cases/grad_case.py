"""Run gradient-equivalence cases in this interpreter; one JSON line per case.

    python grad_case.py [--default-checkpointing] [--function unsloth] CASE[@default] [CASE ...]

For each case (tools/hotfix_lab/infra/tiny_models.py's BUILDERS) hotfix's
comparison engine (``check_model``) runs one step without checkpointing and one
with it (explicit ``use_reentrant=True``, or ``gradient_checkpointing_enable()``
with ``--default-checkpointing``, or for one case written ``CASE@default``) and compares every
parameter gradient at 1e-6 relative.  ``--function unsloth``: unsloth-zoo's ``UnslothCheckpointFunction`` (the release on
PYTHONPATH, loaded on CPU by zoo_loader) swapped in for torch's reentrant one first, as unsloth does.  A loss cut off the graph fails in ``backward()``, as in a training
script.  The engine's guard stops a runaway step (WavLM unpatched grows without
bound): the case reports ``guard``, or, stuck inside one call, the process
prints that line and exits with status 3.
"""

from __future__ import annotations

import json
import os
import sys

MEMORY_LIMIT_BYTES = int(os.environ.get("GRAD_CASE_RSS_LIMIT", 3 * 2**30))
TIME_LIMIT_S = float(os.environ.get("GRAD_CASE_TIME_LIMIT", 120))
#: engine status -> this runner's (the tests' vocabulary)
STATUS = {"equal": "equal", "wrong": "differs", "crash": "crash", "guard": "guard", "not-supported": "crash"}


def case_result(report, result):
    """Fill ``result`` from a one-mode CheckReport, in the tests' vocabulary (equal / differs / crash / guard)."""
    step = report.modes[0]
    if report.reference.status != "reference":
        result.update(status="error", error=report.reference.error)
    elif step.grads is None:
        result.update(status=STATUS.get(step.status, step.status), error=step.error)
    else:
        result.update(status=STATUS[step.status], loss=step.loss, summary=step.grads.summary(),
                      missing=len(step.missing), wrong=len(step.wrong), total=step.total, max_error=step.max_error)
    return result


def run(case, mode):
    import transformers

    from hotfix_lab.infra import tiny_models  # tools/hotfix_lab (on the child's PYTHONPATH)
    from hotfix.diagnostics.checker import check_model

    result = {"case": case, "transformers": transformers.__version__}
    try:
        model, batch = tiny_models.BUILDERS[case]()
    except ImportError as exc:
        result.update(status="n/a", error=repr(exc))
        return result

    def last_words(reason):
        print(json.dumps(dict(result, status="guard", error=reason)), flush=True)

    report = check_model(model, batch, modes=[mode], rtol=1e-6, cut="raise", memory_limit=MEMORY_LIMIT_BYTES,
                         time_limit=TIME_LIMIT_S, grace=20.0, last_words=last_words)
    return case_result(report, result)


def main(argv):
    mode = "reentrant"
    if argv and argv[0] == "--default-checkpointing":
        mode, argv = "default", argv[1:]
    if argv[:2] == ["--function", "unsloth"]:
        from hotfix_lab.infra.zoo_loader import install_unsloth_swap, load_release  # tools/hotfix_lab

        install_unsloth_swap(load_release())
        argv = argv[2:]
    cases = [token.partition("@") for token in argv]
    odd = [token for token, (_, at, suffix) in zip(argv, cases) if at and suffix != "default"]
    if odd:  # a typo must not measure the child's mode under a name that says otherwise
        print(f"grad_case.py: {', '.join(odd)}: the only suffix is @default", file=sys.stderr)
        return 2
    for token, (case, _, suffix) in zip(argv, cases):  # CASE@default: gradient_checkpointing_enable()'s default
        result = run(case, "default" if suffix == "default" else mode)
        print(json.dumps(dict(result, case=token)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
