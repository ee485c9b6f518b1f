"""The one gradient comparison: every parameter equal / missing / unexpected / wrong.

Everything that compares a checkpointed step with a step without
checkpointing (``check-model``, ``doctor``, the tests, the sweep, the
benchmarks, the GPU kit) classifies gradients here, with one tolerance rule.

Why the error is not plain per-parameter relative error: some gradients are
zero in exact arithmetic (an attention key bias, for one: softmax is invariant
to adding a constant per query) and hold only rounding noise, so their
relative error is noise divided by noise.  Each parameter's error is therefore
measured against ``max(|g_ref|, floor * |G_ref|)``, the larger of its own
gradient norm and a small fraction of the whole model's gradient norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import torch

#: default tolerance by dtype: recomputation repeats the same kernels, so fp32
#: agrees to rounding; half precisions get their own epsilon-scaled bounds.
TOLERANCE_BY_DTYPE = {
    "float64": 1e-10,
    "float32": 1e-6,
    "bfloat16": 2e-2,
    "float16": 2e-3,
}  # by name: this module imports no torch (``hotfix status`` uses short_error)
FLOOR = 1e-3


def collect_grads(model) -> Dict[str, Optional["torch.Tensor"]]:
    """name -> detached copy of .grad (None where no gradient arrived), trainable params only."""
    return {
        name: (None if p.grad is None else p.grad.detach().clone())
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def tolerance_for(dtype) -> float:
    """The relative tolerance for a ``torch.dtype`` (or its name, "float32")."""
    return TOLERANCE_BY_DTYPE.get(str(dtype).replace("torch.", ""), 1e-6)


@dataclass
class GradReport:
    equal: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)  # reference has a gradient, candidate none
    unexpected: List[str] = field(default_factory=list)  # candidate has one, reference none
    wrong: List[Tuple[str, float]] = field(default_factory=list)
    max_error: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.wrong)

    @property
    def total(self) -> int:
        return len(self.equal) + len(self.missing) + len(self.unexpected) + len(self.wrong)

    def state(self, name: str) -> str:
        """One parameter's verdict: equal | missing | unexpected | wrong (<error>)."""
        if name in self.missing:
            return "missing"
        if name in self.unexpected:
            return "unexpected"
        for wrong_name, error in self.wrong:
            if wrong_name == name:
                return f"wrong ({error:.1e})"
        return "equal"

    def summary(self) -> str:
        text = f"{len(self.equal)}/{self.total} parameter gradients equal (max rel. error {self.max_error:.1e})"
        return text + describe_problems(self.missing, self.wrong, self.unexpected)


def describe_problems(missing: List[str], wrong: List[Tuple[str, float]], unexpected: List[str]) -> str:
    """'; 3 missing (e.g. name); ...' for the non-equal parameters of a comparison."""
    text = ""
    if missing:
        text += f"; {len(missing)} missing (e.g. {missing[0]})"
    if wrong:
        text += f"; {len(wrong)} wrong (e.g. {wrong[0][0]}: {wrong[0][1]:.1e})"
    if unexpected:
        text += f"; {len(unexpected)} unexpected (e.g. {unexpected[0]})"
    return text


def compare_grads(
    reference: Dict[str, Optional["torch.Tensor"]],
    candidate: Dict[str, Optional["torch.Tensor"]],
    rtol: Optional[float] = None,
    floor: float = FLOOR,
) -> GradReport:
    """Classify every parameter as equal / missing / unexpected / wrong.

    ``missing``: the reference has a gradient (even an all-zero one) and the
    candidate has none; ``unexpected``: the other way round.
    """
    report = GradReport()
    total_sq = sum(float(g.double().pow(2).sum()) for g in reference.values() if g is not None)
    scale_all = math.sqrt(total_sq)
    for name, ref in reference.items():
        got = candidate.get(name)
        # No gradient (None) and a zero gradient are different steps for an
        # optimizer: AdamW skips a parameter whose .grad is None entirely (no
        # update, no weight decay, no moment update).  So None only ever equals None.
        if ref is None:
            if got is not None:
                report.unexpected.append(name)
            else:
                report.equal.append(name)
            continue
        if got is None:
            report.missing.append(name)
            continue
        tol = rtol if rtol is not None else tolerance_for(ref.dtype)
        denom = max(float(ref.double().norm()), floor * scale_all, 1e-30)
        error = float((got.double() - ref.double()).norm()) / denom
        if math.isnan(error):  # a NaN gradient is infinitely wrong (max() would skip NaN and report 0.0)
            error = math.inf
        report.max_error = max(report.max_error, error)
        if error <= tol:
            report.equal.append(name)
        else:
            report.wrong.append((name, error))
    return report


def short_error(exc: BaseException, limit: int = 300) -> str:
    """``Type: first sentence of the first line`` -- the one-line form every report uses for an exception."""
    lines = str(exc).strip().splitlines()
    text = lines[0].split(" (")[0].split(". ")[0] if lines else ""
    return f"{type(exc).__name__}: {text[:limit]}" if text else type(exc).__name__
