"""What a check found: one :class:`ModeResult` per step, the :class:`CheckReport` over all of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from hotfix.diagnostics.compare import GradReport, describe_problems
from hotfix.diagnostics.memory import fmt_bytes


@dataclass
class ModeResult:
    """One step of the check: the reference (mode ``none``) or a checkpointing mode."""

    mode: str
    status: str  # equal | wrong | crash | guard | not-supported | reference | error
    checkpoint_function: Optional[str] = None
    loss: Optional[float] = None
    #: what ``loss`` is: the model's own loss, the caller's loss_fn, or (no loss in the output) a projection
    loss_source: str = "model"
    #: the loss reached no parameter: checkpointing cut the whole graph (every gradient missing)
    graph_cut: bool = False
    error: Optional[str] = None
    #: the gradient comparison with the reference (None: no comparison, e.g. the step crashed)
    grads: Optional[GradReport] = None
    saved_bytes: Optional[int] = None
    saved_tensors: Optional[int] = None
    peak_rss_delta: Optional[int] = None
    peak_cuda_delta: Optional[int] = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "equal"

    # The comparison's figures, read through (zero / empty where there was no comparison).
    @property
    def equal(self) -> int:
        return len(self.grads.equal) if self.grads else 0

    @property
    def missing(self) -> List[str]:
        return self.grads.missing if self.grads else []

    @property
    def wrong(self) -> List[Tuple[str, float]]:
        return self.grads.wrong if self.grads else []

    @property
    def unexpected(self) -> List[str]:
        return self.grads.unexpected if self.grads else []

    @property
    def max_error(self) -> float:
        return self.grads.max_error if self.grads else 0.0

    @property
    def total(self) -> int:
        return self.grads.total if self.grads else 0

    def summary(self) -> str:
        if self.status in ("crash", "guard", "not-supported", "error"):
            return f"{self.status.upper()}: {self.error}"
        if self.status == "reference":
            return f"loss {self.loss:.6g}"
        text = f"{self.equal}/{self.total} gradients equal (max rel. error {self.max_error:.1e})"
        if self.graph_cut:
            text += "; the loss does not require grad: checkpointing cut it off the graph"
        return text + describe_problems(self.missing, self.wrong, self.unexpected)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "mode": self.mode, "status": self.status, "checkpoint_function": self.checkpoint_function,
            "loss": self.loss, "loss_source": self.loss_source, "graph_cut": self.graph_cut, "error": self.error, "equal": self.equal, "total": self.total,
            "missing": list(self.missing), "wrong": [[n, e] for n, e in self.wrong],
            "unexpected": list(self.unexpected), "max_error": self.max_error,
            "saved_bytes": self.saved_bytes, "saved_tensors": self.saved_tensors,
            "peak_rss_delta": self.peak_rss_delta, "peak_cuda_delta": self.peak_cuda_delta,
            "seconds": round(self.seconds, 3), "summary": self.summary(),
        }


@dataclass
class CheckReport:
    """Result of :func:`check_model`; ``safe`` says whether every mode gave the reference gradients."""

    model: str
    reference: ModeResult
    modes: List[ModeResult]
    parameters: List[str]
    tolerance: Dict[str, float]
    floor: float
    versions: Dict[str, Optional[str]]
    hotfix_active: bool
    memory_limit: int
    # name -> mode -> "equal" | "missing" | "wrong <err>" | "unexpected"
    per_parameter: Dict[str, Dict[str, str]] = field(default_factory=dict)
    #: trainable parameters that get no gradient even without checkpointing: their "equal" (None in
    #: both steps) says nothing about checkpointing (adapters the model never calls, unused heads)
    without_gradient: List[str] = field(default_factory=list)
    #: "fix: why" for each fix that does not repair here what this model may need (``hotfix.status.not_covered``)
    not_covered: List[str] = field(default_factory=list)

    @property
    def checked_modes(self) -> List[ModeResult]:
        return [m for m in self.modes if m.status != "not-supported"]

    @property
    def supported(self) -> bool:
        return bool(self.checked_modes)

    @property
    def safe(self) -> bool:
        """Every checkpointing mode that the model supports gives the reference gradients."""
        return self.reference.status == "reference" and self.supported and all(m.ok for m in self.checked_modes)

    @property
    def unsafe_modes(self) -> List[str]:
        return [m.mode for m in self.checked_modes if not m.ok]

    def mode(self, name: str) -> ModeResult:
        for m in self.modes:
            if m.mode == name:
                return m
        raise KeyError(name)

    @property
    def verdict(self) -> str:
        if self.reference.status != "reference":
            return f"could not check: the step without checkpointing fails ({self.reference.error})"
        if not self.supported:
            return "not supported: " + (self.modes[0].error if self.modes else "no checkpointing mode checked")
        if self.safe:
            return "SAFE: every checkpointing mode gives the gradients of the step without checkpointing"
        return "UNSAFE with " + ", ".join(self.unsafe_modes)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "model": self.model, "safe": self.safe, "verdict": self.verdict,
            "hotfix_active": self.hotfix_active, "versions": self.versions,
            "tolerance": self.tolerance, "floor": self.floor, "memory_limit": self.memory_limit,
            "parameters": len(self.parameters), "without_gradient": list(self.without_gradient),
            "not_covered": list(self.not_covered),
            "reference": self.reference.to_dict(), "modes": [m.to_dict() for m in self.modes],
        }

    def format(self, verbose: bool = False) -> str:
        lines = [
            f"model: {self.model}  ({len(self.parameters)} trainable parameters)",
            "versions: " + ", ".join(f"{k} {v}" for k, v in self.versions.items() if v)
            + f"; hotfix {'active' if self.hotfix_active else 'INACTIVE'}",
            "tolerance: " + ", ".join(f"{k} {v:g}" for k, v in self.tolerance.items())
            + f" relative, floor {self.floor:g} x whole-gradient norm",
            "",
            f"{'mode':<14} {'result':<8} {'saved for bwd':>14} {'peak RSS delta*':>16} {'time':>7}  details",
        ]
        for m in [self.reference] + self.modes:
            result = {"reference": "ref", "equal": "EQUAL"}.get(m.status, m.status.upper())
            details = m.summary() if m.status != "reference" else f"loss {m.loss:.6g}"
            if m.loss is not None and m.status != "reference" and m.status in ("equal", "wrong"):
                details = f"loss {m.loss:.6g}; " + details
            if m.loss_source != "model" and m.status == "reference":
                details += f" ({m.loss_source})"
            if m.checkpoint_function and m.status != "not-supported":
                details += f"  [checkpoint: {m.checkpoint_function}]"
            lines.append(
                f"{m.mode:<14} {result:<8} {fmt_bytes(m.saved_bytes):>14} {fmt_bytes(m.peak_rss_delta):>16} "
                f"{m.seconds:>6.1f}s  {details}"
            )
        if self.without_gradient:
            lines.append(f"{len(self.without_gradient)} of {len(self.parameters)} trainable parameters get no gradient "
                         f"even without checkpointing (e.g. {self.without_gradient[0]}): nothing to compare for them")
        lines.append("* peak RSS sampled every 10 ms minus RSS at the step's start (CPU; noisy, indicative only)"
                     + ("; CUDA peaks in --json" if any(m.peak_cuda_delta for m in self.modes) else ""))
        bad = {n: s for n, s in self.per_parameter.items() if any(v != "equal" for v in s.values())}
        if bad or verbose:
            lines.append("")
            lines.append("per parameter (" + ("all" if verbose else "only those not equal in some mode") + "):")
            shown = self.per_parameter if verbose else bad
            limit = None if verbose else 40
            for i, (name, states) in enumerate(shown.items()):
                if limit is not None and i >= limit:
                    lines.append(f"  ... {len(shown) - limit} more (use --verbose / --json)")
                    break
                lines.append(f"  {name}: " + ", ".join(f"{mode} {state}" for mode, state in states.items()))
        lines.append("")
        lines.append("verdict: " + self.verdict)
        lines += [f"NOT COVERED here: {line}" for line in self.not_covered]
        return "\n".join(lines)
