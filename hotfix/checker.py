"""Is gradient checkpointing safe for *this* model?  Catch silent gradient loss.

The worst checkpointing failures do not crash: with reentrant checkpointing some
parameters silently get no gradient, or a wrong one.  :func:`check_model` runs
one training step on the user's own model and batch

* without checkpointing (the reference),
* with each checkpointing mode: ``reentrant``
  (``gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})``),
  ``non-reentrant`` (``use_reentrant=False``) and ``default``
  (``gradient_checkpointing_enable()`` with no arguments: the model's own default
  and whatever checkpoint function is installed, e.g. unsloth's; its qualified
  name is reported),

with the same seed, and classifies every trainable parameter's gradient as
equal, missing or wrong (hotfix.gradcheck: relative error above a
dtype-dependent tolerance, measured against ``max(|g_ref|, floor * |G_ref|)``
so gradients that are zero in exact arithmetic do not flag falsely).  It also
reports the bytes saved for backward during the forward (deduplicated by
storage) and the peak memory of each mode.

Afterwards the model is as it was: training flags, checkpointing attributes,
forward hooks, buffers (BatchNorm statistics), ``.grad`` of every parameter and
the RNG states of torch, CUDA, ``random`` and numpy.

A watchdog guards each step: when the process RSS grows more than
``memory_limit`` above where the check started, or the step runs longer than
``time_limit``, the step is aborted from the next saved-tensor pack hook or
module call (both also run inside the recomputation of reentrant
checkpointing) and reported as ``guard`` with the reason, instead of the
machine's OOM killer ending the process.  If the step does not return within
``grace`` seconds of that (a runaway inside one C++ call) and ``hard_exit`` is
on, the process prints the reason to stderr and exits with status 3.
"""

from __future__ import annotations

import gc
import math
import os
import random
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from hotfix.gradcheck import FLOOR, GradReport, collect_grads, compare_grads, describe_problems, tolerance_for

MODES = ("reentrant", "non-reentrant", "default")
GUARD_EXIT_STATUS = 3
_SAMPLE_INTERVAL_S = 0.01


class CheckerError(RuntimeError):
    """The check itself could not run (no loss, reference step failed, ...)."""


class GuardTripped(RuntimeError):
    """Raised inside a step when the memory or time guard fires."""


# -- memory ---------------------------------------------------------------------
def rss_bytes() -> Optional[int]:
    """Resident set size of this process, or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def available_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except Exception:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:
        return None


def _release_memory() -> None:
    """gc, then hand freed heap back to the OS (glibc) so RSS reflects what is live."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except Exception:
        pass


def default_memory_limit() -> int:
    """min(50% of the memory available now, 8 GiB): RSS growth allowed per step."""
    cap = 8 * 2**30
    avail = available_bytes()
    return cap if avail is None else int(min(avail * 0.5, cap))


def parse_bytes(text: str) -> int:
    """'4GiB', '512M', '1.5G', '1000000' -> bytes (binary units)."""
    s = str(text).strip().lower().replace(" ", "")
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    for suffix in ("ib", "b"):
        if s.endswith(suffix) and len(s) > len(suffix) and s[-len(suffix) - 1] in units:
            s = s[: -len(suffix)]
            break
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(float(s))


def _fmt_bytes(n: Optional[int]) -> str:
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024.0
    return f"{sign}{n} B"  # pragma: no cover


class _Watchdog:
    """Samples RSS; sets ``reason`` when a step exceeds the memory or time limit."""

    def __init__(self, baseline: int, memory_limit: int, hard_exit: bool, grace: float) -> None:
        self.baseline = baseline
        self.memory_limit = memory_limit
        self.hard_exit = hard_exit
        self.grace = grace
        self.reason: Optional[str] = None
        self._tripped_at: Optional[float] = None
        self._step: Optional[Tuple[str, float, float]] = None  # (label, started, time_limit)
        self.peak = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="hotfix-check-watchdog", daemon=True)
        self._thread.start()

    def begin(self, label: str, time_limit: float) -> None:
        with self._lock:
            self.reason = None
            self._tripped_at = None
            self.peak = rss_bytes() or 0
            self.baseline = self.peak
            self._step = (label, time.monotonic(), time_limit)

    def end(self) -> None:
        with self._lock:
            self._step = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)

    def _loop(self) -> None:
        while not self._stop.wait(_SAMPLE_INTERVAL_S):
            with self._lock:
                step = self._step
                if step is None:
                    continue
                label, started, time_limit = step
                rss = rss_bytes() or 0
                self.peak = max(self.peak, rss)
                now = time.monotonic()
                if self.reason is None:
                    if rss - self.baseline > self.memory_limit:
                        self.reason = (
                            f"memory guard: RSS grew {_fmt_bytes(rss - self.baseline)} during the {label} step, "
                            f"over the limit of {_fmt_bytes(self.memory_limit)} (runaway memory)"
                        )
                    elif now - started > time_limit:
                        self.reason = f"time guard: the {label} step ran over {time_limit:.0f} s"
                    if self.reason is not None:
                        self._tripped_at = now
                elif self.hard_exit and self._tripped_at is not None and now - self._tripped_at > self.grace:
                    sys.stderr.write(
                        f"hotfix check-model: {self.reason}; the step did not stop within {self.grace:.0f} s, "
                        f"exiting with status {GUARD_EXIT_STATUS} before the OOM killer does\n"
                    )
                    sys.stderr.flush()
                    os._exit(GUARD_EXIT_STATUS)

    def check(self) -> None:
        reason = self.reason
        if reason is not None:
            raise GuardTripped(reason)


# -- results --------------------------------------------------------------------
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
    equal: int = 0
    missing: List[str] = field(default_factory=list)
    wrong: List[Tuple[str, float]] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    max_error: float = 0.0
    saved_bytes: Optional[int] = None
    saved_tensors: Optional[int] = None
    peak_rss_delta: Optional[int] = None
    peak_cuda_delta: Optional[int] = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "equal"

    @property
    def total(self) -> int:
        return self.equal + len(self.missing) + len(self.wrong) + len(self.unexpected)

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
            "parameters": len(self.parameters),
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
                f"{m.mode:<14} {result:<8} {_fmt_bytes(m.saved_bytes):>14} {_fmt_bytes(m.peak_rss_delta):>16} "
                f"{m.seconds:>6.1f}s  {details}"
            )
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
        return "\n".join(lines)


# -- state ----------------------------------------------------------------------
_CKPT_ATTRS = ("gradient_checkpointing", "_gradient_checkpointing_func", "_require_grads_hook")
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")
_MISSING = object()


class _ModelState:
    """What a check may change on a model, snapshotted so it can be put back exactly."""

    def __init__(self, model) -> None:
        import torch

        self.model = model
        self.training = [(m, m.training) for m in model.modules()]
        self.attrs = [(m, {a: m.__dict__.get(a, _MISSING) for a in _CKPT_ATTRS}) for m in model.modules()]
        self.hooks = [(m, {h: dict(getattr(m, h)) for h in _HOOK_DICTS if isinstance(getattr(m, h, None), dict)})
                      for m in model.modules()]
        self.grads = [(p, p.grad) for p in model.parameters()]
        self.buffers = [(b, b.detach().clone()) for b in model.buffers()]
        config = getattr(model, "config", None)
        self.config = (config, dict(config.__dict__)) if config is not None and hasattr(config, "__dict__") else None
        self.rng = _RngState(torch)

    def restore_checkpointing(self) -> None:
        for m, attrs in self.attrs:
            for name, value in attrs.items():
                if value is _MISSING:
                    m.__dict__.pop(name, None)
                else:
                    m.__dict__[name] = value
        for m, hooks in self.hooks:
            for name, saved in hooks.items():
                current = getattr(m, name)
                if dict(current) != saved:
                    current.clear()
                    current.update(saved)

    def restore(self) -> None:
        import torch

        self.restore_checkpointing()
        for m, training in self.training:
            m.training = training
        for p, g in self.grads:
            p.grad = g
        with torch.no_grad():
            for b, saved in self.buffers:
                if b.shape == saved.shape:
                    b.copy_(saved)
        if self.config is not None:
            config, saved = self.config
            for key in [k for k in config.__dict__ if k not in saved]:
                del config.__dict__[key]
            config.__dict__.update(saved)
        self.rng.restore()


class _RngState:
    def __init__(self, torch) -> None:
        self.torch = torch
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self.python = random.getstate()
        np = sys.modules.get("numpy")
        self.numpy = np.random.get_state() if np is not None else None

    def restore(self) -> None:
        self.torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            self.torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy"].random.set_state(self.numpy)


def _seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)  # also seeds every CUDA device
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed)


# -- checkpointing modes ----------------------------------------------------------
def describe_function(fn: Any) -> str:
    """Qualified name of a checkpoint function, with partial keywords and unsloth-style swaps shown."""
    import functools

    if fn is None:
        return "none"
    inner = getattr(fn, "__wrapped__", None)
    if isinstance(fn, functools.partial):
        kw = ", ".join(f"{k}={v!r}" for k, v in fn.keywords.items())
        return f"{describe_function(fn.func)}({kw})" if kw else describe_function(fn.func)
    if inner is not None and inner is not fn and type(fn).__module__.startswith("wrapt"):
        return f"{describe_function(inner)} (wrapped)"
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', None) or type(fn).__qualname__}"


def installed_checkpoint() -> str:
    """What torch.utils.checkpoint holds now (unsloth and others swap these)."""
    import torch.utils.checkpoint as tuc

    parts = [describe_function(tuc.checkpoint)]
    cf = getattr(tuc, "CheckpointFunction", None)
    if cf is not None and getattr(cf, "__module__", "") != "torch.utils.checkpoint":
        parts.append(f"CheckpointFunction={cf.__module__}.{cf.__qualname__}")
    tm = sys.modules.get("transformers.modeling_utils")
    ckpt = getattr(tm, "checkpoint", None) if tm is not None else None
    if ckpt is not None and ckpt is not tuc.checkpoint:
        parts.append(f"transformers.modeling_utils.checkpoint={describe_function(ckpt)}")
    return "; ".join(parts)


def _layer_function(model) -> Optional[str]:
    for m in model.modules():
        fn = m.__dict__.get("_gradient_checkpointing_func")
        if fn is not None and getattr(m, "gradient_checkpointing", False):
            return describe_function(fn)
    return None


def _enable(model, mode: str) -> str:
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise NotImplementedError(f"{type(model).__name__} has no gradient_checkpointing_enable()")
    if getattr(model, "supports_gradient_checkpointing", True) is False:
        raise NotImplementedError(f"{type(model).__name__}.supports_gradient_checkpointing is False")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if mode == "reentrant":
            enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        elif mode == "non-reentrant":
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif mode == "default":
            enable()
        else:
            raise ValueError(f"unknown checkpointing mode {mode!r}; known: {', '.join(MODES)}")
    held = _layer_function(model)
    if held is None:
        raise NotImplementedError("gradient_checkpointing_enable() set no checkpoint function on any layer")
    return held if mode != "default" else f"{held}; installed: {installed_checkpoint()}"


def _disable(model) -> None:
    disable = getattr(model, "gradient_checkpointing_disable", None)
    if disable is not None and getattr(model, "is_gradient_checkpointing", False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            disable()


# -- one step -------------------------------------------------------------------
def _call(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _first_float_tensor(output):
    import torch

    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    if isinstance(output, dict) or hasattr(output, "values") and callable(output.values):
        items = list(output.values())
    elif isinstance(output, (tuple, list)):
        items = list(output)
    else:
        return None
    for item in items:
        found = _first_float_tensor(item)
        if found is not None:
            return found
    return None


def model_loss(output):
    """The model's own scalar loss tensor (``output.loss`` / ``output["loss"]``), or None."""
    import torch

    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def default_loss(output, batch):
    """``output.loss`` if the model computed one (required grad or not), else a fixed random projection of the first float output.

    A random projection, not ``.sum()``/``.mean()``: those are invariant to
    shifts that LayerNorm-style outputs absorb, which would make many
    gradients zero in exact arithmetic.
    """
    import torch

    loss = model_loss(output)
    if loss is not None:
        # The model's own loss, even where it does not require grad: then
        # checkpointing cut it off the graph and every gradient is missing
        # (a projection of another output would hide that and report a made-up loss).
        return loss
    tensor = _first_float_tensor(output)
    if tensor is None:
        raise CheckerError("the model's output has no loss and no float tensor; pass loss_fn")
    g = torch.Generator().manual_seed(1234)
    weights = torch.randn(tensor.shape, generator=g, dtype=torch.float32).to(tensor.device)
    return (tensor.float() * weights).sum() / math.sqrt(max(tensor.numel(), 1))


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:300]}"


def _step(model, batch, loss_fn, seed, watchdog: _Watchdog, label: str, time_limit: float, result: ModeResult):
    """One forward+backward, with saved-tensor accounting and the guard; fills ``result``."""
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook

    seen: Dict[Tuple[str, int], int] = {}
    state = {"forward": True}

    def pack(t):
        watchdog.check()
        if state["forward"]:
            try:
                storage = t.untyped_storage()
                key = (str(t.device), storage.data_ptr())
                seen[key] = max(seen.get(key, 0), storage.nbytes())
            except Exception:
                pass
        return t

    def pre_hook(module, args):
        watchdog.check()

    cuda = torch.cuda.is_available() and any(p.is_cuda for p in model.parameters())
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_start = torch.cuda.memory_allocated()
    model.zero_grad(set_to_none=True)
    _seed(seed)
    handle = register_module_forward_pre_hook(pre_hook)
    watchdog.begin(label, time_limit)
    rss_start = watchdog.peak
    started = time.monotonic()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = _call(model, batch)
            loss = loss_fn(output, batch)
            if loss_fn is not default_loss:
                result.loss_source = "loss_fn"
            elif model_loss(output) is None:
                result.loss_source = "projection of the first float output"
            state["forward"] = False
            result.saved_bytes = sum(seen.values())
            result.saved_tensors = len(seen)
            del output
            if loss.requires_grad:
                loss.backward()
            elif label.startswith("reference"):
                raise CheckerError("the loss does not require grad without checkpointing: nothing to check")
            else:  # checkpointing cut every path to the loss; every gradient is missing
                result.graph_cut = True
        result.loss = float(loss.detach())
        del loss
        watchdog.check()
    finally:
        handle.remove()
        watchdog.end()
        result.seconds = time.monotonic() - started
        result.peak_rss_delta = watchdog.peak - rss_start if rss_start else None
        if cuda:
            torch.cuda.synchronize()
            result.peak_cuda_delta = torch.cuda.max_memory_allocated() - cuda_start


# -- the check ------------------------------------------------------------------
def check_model(
    model,
    batch,
    *,
    loss_fn: Optional[Callable[[Any, Any], Any]] = None,
    modes: Sequence[str] = MODES,
    seed: int = 0,
    rtol: Optional[float] = None,
    floor: float = FLOOR,
    memory_limit: Optional[int] = None,
    time_limit: float = 600.0,
    hard_exit: bool = True,
    grace: float = 60.0,
) -> CheckReport:
    """One training step without checkpointing and one per checkpointing mode; gradients compared.

    ``batch`` is passed as ``model(**batch)`` (dict), ``model(*batch)``
    (tuple/list) or ``model(batch)``.  ``loss_fn(output, batch)`` defaults to
    :func:`default_loss`.  ``rtol`` overrides the per-dtype tolerance
    (``hotfix.gradcheck.TOLERANCE_BY_DTYPE``).  ``memory_limit`` is the RSS
    growth in bytes allowed during one step (from the step's start) (default
    :func:`default_memory_limit`), ``time_limit`` the seconds per step.
    Returns a :class:`CheckReport`; ``report.safe`` is the answer.  The model's
    state is restored before returning, also when a step fails.
    """
    import torch

    loss_fn = loss_fn or default_loss
    memory_limit = int(memory_limit) if memory_limit is not None else default_memory_limit()
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown checkpointing mode(s) {unknown}; known: {', '.join(MODES)}")
    gc.collect()
    snapshot = _ModelState(model)
    watchdog = _Watchdog(rss_bytes() or 0, memory_limit, hard_exit, grace)
    reference = ModeResult(mode="none", status="reference", checkpoint_function="none")
    results: List[ModeResult] = []
    per_parameter: Dict[str, Dict[str, str]] = {}
    try:
        model.train()
        _disable(model)
        snapshot.restore_checkpointing()
        for m, attrs in snapshot.attrs:  # no checkpointing for the reference, whatever the user had on
            if attrs["gradient_checkpointing"] is not _MISSING:
                m.__dict__["gradient_checkpointing"] = False
        try:
            _step(model, batch, loss_fn, seed, watchdog, "reference (no checkpointing)", time_limit, reference)
        except GuardTripped as exc:
            reference.status, reference.error = "guard", str(exc)
        except Exception as exc:
            reference.status, reference.error = "error", _short_error(exc)
        ref_grads = collect_grads(model) if reference.status == "reference" else {}
        names = list(ref_grads)
        for name in names:
            per_parameter[name] = {}
        model.zero_grad(set_to_none=True)
        _release_memory()

        for mode in modes:
            result = ModeResult(mode=mode, status="equal")
            results.append(result)
            if reference.status != "reference":
                result.status, result.error = "error", "not run: the reference step failed"
                continue
            snapshot.restore_checkpointing()
            model.train()
            try:
                result.checkpoint_function = _enable(model, mode)
            except (NotImplementedError, ValueError, AttributeError) as exc:
                result.status, result.error = "not-supported", _short_error(exc)
                continue
            try:
                _step(model, batch, loss_fn, seed, watchdog, mode, time_limit, result)
            except GuardTripped as exc:
                result.status, result.error = "guard", str(exc)
            except Exception as exc:
                result.status, result.error = "crash", _short_error(exc)
            if result.status == "equal":
                report: GradReport = compare_grads(ref_grads, collect_grads(model), rtol=rtol, floor=floor)
                result.equal = len(report.equal)
                result.missing, result.wrong, result.unexpected = report.missing, report.wrong, report.unexpected
                result.max_error = report.max_error
                result.status = "equal" if report.ok else "wrong"
                wrong = dict(report.wrong)
                for name in names:
                    if name in report.missing:
                        per_parameter[name][mode] = "missing"
                    elif name in wrong:
                        per_parameter[name][mode] = f"wrong ({wrong[name]:.1e})"
                    elif name in report.unexpected:
                        per_parameter[name][mode] = "unexpected"
                    else:
                        per_parameter[name][mode] = "equal"
            else:
                for name in names:
                    per_parameter[name][mode] = "no result"
            model.zero_grad(set_to_none=True)
            _release_memory()
    finally:
        watchdog.stop()
        snapshot.restore()

    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.requires_grad})
    tolerance = {d: (rtol if rtol is not None else tolerance_for(getattr(torch, d))) for d in dtypes}
    return CheckReport(
        model=type(model).__name__, reference=reference, modes=results, parameters=names or
        [n for n, p in model.named_parameters() if p.requires_grad],
        tolerance=tolerance, floor=floor, versions=_versions(), hotfix_active=_hotfix_active(),
        memory_limit=memory_limit, per_parameter=per_parameter,
    )


def _versions() -> Dict[str, Optional[str]]:
    import torch

    out: Dict[str, Optional[str]] = {"torch": torch.__version__}
    for name in ("transformers", "peft", "unsloth", "unsloth_zoo"):
        module = sys.modules.get(name)
        out[name] = getattr(module, "__version__", None) if module is not None else None
    return out


def _hotfix_active() -> bool:
    try:
        from hotfix.registry import registry

        return bool(registry.active)
    except Exception:  # pragma: no cover
        return False


# -- loading a user's factory (CLI) -------------------------------------------------
def load_factory(target: str) -> Callable[[], Any]:
    """``pkg.module:callable`` or ``path/to/file.py:callable`` -> the callable."""
    import importlib
    import importlib.util

    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise CheckerError(f"expected MODULE:CALLABLE or FILE.py:CALLABLE, got {target!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
        if spec is None or spec.loader is None:
            raise CheckerError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise CheckerError(f"{target} is not callable")
    return obj


def unpack_factory_result(result: Any) -> Tuple[Any, Any, Optional[Callable]]:
    """(model, batch) | (model, batch, loss_fn) | {"model":..., "batch":..., "loss_fn":...}."""
    if isinstance(result, dict):
        try:
            return result["model"], result["batch"], result.get("loss_fn")
        except KeyError as exc:
            raise CheckerError(f"the factory's dict lacks {exc}") from None
    if isinstance(result, (tuple, list)) and len(result) in (2, 3):
        return result[0], result[1], (result[2] if len(result) == 3 else None)
    raise CheckerError("the factory must return (model, batch), (model, batch, loss_fn) or a dict with those keys")
