"""Is gradient checkpointing safe for *this* model?  Catch silent gradient loss.

The worst checkpointing failures do not crash: with reentrant checkpointing some
parameters silently get no gradient, or a wrong one.  :func:`check_model` runs
one training step on the user's own model and batch without checkpointing (the
reference) and one per checkpointing mode (``modes.py``), with the same seed,
and classifies every trainable parameter's gradient as equal, missing, wrong or
unexpected (``compare.py``: the one tolerance rule).  It also reports the bytes
saved for backward during the forward (deduplicated by storage) and the peak
memory of each step (``step.py``), under a memory and time guard (``guard.py``).
Afterwards the model is as it was (``model_state.py``).

This is the comparison engine of the project: ``hotfix check-model``,
``hotfix doctor``, the tests' case runner and the model sweep all call it.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, Dict, List, Optional, Sequence

from hotfix.diagnostics.compare import FLOOR, collect_grads, compare_grads, short_error, tolerance_for
from hotfix.diagnostics.guard import GuardTripped, Watchdog
from hotfix.diagnostics.memory import default_memory_limit, release_memory, rss_bytes
from hotfix.diagnostics.model_state import MISSING, ModelState
from hotfix.diagnostics.modes import MODES, disable, enable, mode_name, unknown_modes
from hotfix.diagnostics.results import CheckReport, ModeResult
from hotfix.diagnostics.step import CheckerError, default_loss, run_step

__all__ = ["check_model", "CheckReport", "ModeResult", "CheckerError", "MODES", "library_versions"]


def check_model(
    model,
    batch,
    *,
    loss_fn: Optional[Callable[[Any, Any], Any]] = None,
    modes: Sequence[Any] = MODES,
    seed: int = 0,
    rtol: Optional[float] = None,
    floor: float = FLOOR,
    memory_limit: Optional[int] = None,
    time_limit: float = 600.0,
    hard_exit: bool = True,
    grace: float = 60.0,
    cut: str = "report",
    last_words: Optional[Callable[[str], None]] = None,
) -> CheckReport:
    """One training step without checkpointing and one per checkpointing mode; gradients compared.

    ``modes``: names from MODES, or ``(name, enable_function)`` pairs.
    ``batch`` is passed as ``model(**batch)`` (dict), ``model(*batch)``
    (tuple/list) or ``model(batch)``.  ``loss_fn(output, batch)`` defaults to
    :func:`default_loss`.  ``rtol`` overrides the per-dtype tolerance
    (``hotfix.diagnostics.compare.TOLERANCE_BY_DTYPE``).  ``memory_limit`` is the RSS
    growth in bytes allowed during one step (from the step's start) (default
    :func:`default_memory_limit`), ``time_limit`` the seconds per step.
    ``cut="raise"`` lets a checkpointed step whose loss lost its graph fail in
    ``backward()`` as a training script does (the default reports it as
    ``graph_cut``); ``last_words(reason)`` runs before a guard's hard exit.
    Returns a :class:`CheckReport`; ``report.safe`` is the answer.  The model's
    state is restored before returning, also when a step fails.
    """
    loss_fn = loss_fn or default_loss
    memory_limit = int(memory_limit) if memory_limit is not None else default_memory_limit()
    unknown = unknown_modes(modes)
    if unknown:
        raise ValueError(f"unknown checkpointing mode(s) {unknown}; known: {', '.join(MODES)}")
    gc.collect()
    snapshot = ModelState(model)
    watchdog = Watchdog(rss_bytes() or 0, memory_limit, hard_exit, grace, last_words)
    reference = ModeResult(mode="none", status="reference", checkpoint_function="none")
    results: List[ModeResult] = []
    per_parameter: Dict[str, Dict[str, str]] = {}
    try:
        model.train()
        disable(model)
        snapshot.restore_checkpointing()
        for m, attrs in snapshot.attrs:  # no checkpointing for the reference, whatever the user had on
            if attrs["gradient_checkpointing"] is not MISSING:
                m.__dict__["gradient_checkpointing"] = False
        try:
            run_step(model, batch, loss_fn, seed, watchdog, "reference (no checkpointing)", time_limit, reference)
        except GuardTripped as exc:
            reference.status, reference.error = "guard", str(exc)
        except Exception as exc:
            reference.status, reference.error = "error", short_error(exc)
        ref_grads = collect_grads(model) if reference.status == "reference" else {}
        names = list(ref_grads)
        for name in names:
            per_parameter[name] = {}
        model.zero_grad(set_to_none=True)
        release_memory()

        for mode in modes:
            label = mode_name(mode)
            result = ModeResult(mode=label, status="equal")
            results.append(result)
            if reference.status != "reference":
                result.status, result.error = "error", "not run: the reference step failed"
                continue
            snapshot.restore_checkpointing()
            model.train()
            try:
                result.checkpoint_function = enable(model, mode)
            except (NotImplementedError, ValueError, AttributeError) as exc:
                result.status, result.error = "not-supported", short_error(exc)
                continue
            try:
                run_step(model, batch, loss_fn, seed, watchdog, label, time_limit, result, cut)
            except GuardTripped as exc:
                result.status, result.error = "guard", str(exc)
            except Exception as exc:
                result.status, result.error = "crash", short_error(exc)
            if result.status == "equal":
                result.grads = compare_grads(ref_grads, collect_grads(model), rtol=rtol, floor=floor)
                result.status = "equal" if result.grads.ok else "wrong"
                for name in names:
                    per_parameter[name][label] = result.grads.state(name)
            else:
                for name in names:
                    per_parameter[name][label] = "no result"
            model.zero_grad(set_to_none=True)
            release_memory()
    finally:
        watchdog.stop()
        snapshot.restore()

    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.requires_grad})
    tolerance = {d: (rtol if rtol is not None else tolerance_for(d)) for d in dtypes}
    return CheckReport(
        model=type(model).__name__, reference=reference, modes=results, parameters=names or
        [n for n, p in model.named_parameters() if p.requires_grad],
        tolerance=tolerance, floor=floor, versions=library_versions(), hotfix_active=_hotfix_active(),
        memory_limit=memory_limit, per_parameter=per_parameter,
        without_gradient=[name for name, grad in ref_grads.items() if grad is None],
        not_covered=_not_covered(getattr(getattr(model, "config", None), "model_type", None)),
    )


def library_versions() -> Dict[str, Optional[str]]:
    """The versions ``hotfix status`` reports (metadata and module, the module winning), by distribution."""
    from hotfix.versions import REPORTED_LIBRARIES, reader

    libraries = dict(REPORTED_LIBRARIES, peft="peft")
    return {dist: reader.evidence(dist, module).version for dist, module in libraries.items()}


def _not_covered(model_type: Optional[str]) -> List[str]:
    """What hotfix, active, does not repair here for a model of ``model_type`` (``hotfix status``'s NOT COVERED)."""
    from hotfix.registry import registry
    from hotfix.status import not_covered

    if not registry.active:
        return []
    return [f"{fix.name}: {fix.why}" for fix in not_covered(registry, model_type=model_type)]


def _hotfix_active() -> bool:
    try:
        from hotfix.registry import registry

        return bool(registry.active)
    except Exception:  # pragma: no cover
        return False
