"""Benchmarks 3-5: the wrapper's cost on a step with nothing to lift, Whisper step time, memory."""

from __future__ import annotations

import json
import subprocess
import time

from hotfix_lab.bench.bench_common import CHILD_CWD, env_without_hotfix_vars, median, summary


# ---------------------------------------------------------------------------- 3 wrapper
def bench_wrapper(reps):
    import torch

    import hotfix
    import hotfix.checkpointing.inputs as ci
    from hotfix_lab.bench import workloads

    model, batch = workloads.bart()
    model.gradient_checkpointing_enable()  # the 4.x default: reentrant
    layer = model.model.decoder.layers[0]
    assert layer.__dict__["_gradient_checkpointing_func"].keywords == {"use_reentrant": True}

    # Nothing to lift on this path: count what the wrapper lifted during one step.
    lifted = []
    original_lift = ci.lift_closure_tensors
    ci.lift_closure_tensors = lambda f, a: lifted.append(original_lift(f, a)) or lifted[-1]
    workloads.step(model, batch)
    ci.lift_closure_tensors = original_lift
    calls_with_lift = sum(r is not None for r in lifted)

    times = {"hotfix active": [], "hotfix reverted": []}
    for i in range(reps + 2):
        for name in times:
            (hotfix.activate if name == "hotfix active" else hotfix.revert)()
            t = workloads.step(model, batch)
            if i >= 2:
                times[name].append(t)
    hotfix.activate()

    # Per-call cost: read the layer's checkpoint function and call it with a
    # partial that holds no tensor, the exact shape of an unaffected call.
    import functools

    def passthrough(function, *args, **kwargs):
        return function(*args)

    layer.__dict__["_gradient_checkpointing_func"] = passthrough
    x = torch.zeros(1)
    bound = functools.partial(lambda h, **kw: h, flag=True)
    per_call = {}
    n = 20000
    for name in ("hotfix active", "hotfix reverted"):
        (hotfix.activate if name == "hotfix active" else hotfix.revert)()
        samples = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(n):
                layer._gradient_checkpointing_func(bound, x)
            samples.append((time.perf_counter() - t) / n)
        per_call[name] = median(samples)
    hotfix.activate()
    out = {name: summary(ts) for name, ts in times.items()}
    out["ratio active / reverted"] = median(times["hotfix active"]) / median(times["hotfix reverted"])
    out["checkpointed layer calls per step"] = len(lifted)
    out["calls where hotfix lifted a tensor"] = calls_with_lift
    out["per-call overhead (us)"] = 1e6 * (per_call["hotfix active"] - per_call["hotfix reverted"])
    out["target"] = "<= 1.01"
    out["model"] = f"Bart d_model {workloads.BART['d_model']}, {workloads.BART['encoder_layers']}+" \
                   f"{workloads.BART['decoder_layers']} layers, batch {workloads.BART_BATCH}x{workloads.BART_SEQ} tokens"
    return out


# ---------------------------------------------------------------------------- 4 whisper
WHISPER_VARIANTS = {  # name -> (checkpointing variant, hotfix active?)
    "reentrant + hotfix": ("reentrant", True),
    "non-reentrant (upstream)": ("non-reentrant", False),
    "no checkpointing (upstream)": ("none", False),
}


def _use(model, variant):
    import hotfix
    from hotfix_lab.bench import workloads

    checkpointing, active = WHISPER_VARIANTS[variant]
    (hotfix.activate if active else hotfix.revert)()
    workloads.set_checkpointing(model, checkpointing)


def bench_whisper(reps):
    import hotfix
    from hotfix_lab.bench import workloads

    model, batch = workloads.whisper_tiny()
    from hotfix.diagnostics.compare import collect_grads, compare_grads

    grads = {}
    for variant in WHISPER_VARIANTS:  # warm-up, and the gradients agree across variants
        _use(model, variant)
        workloads.step(model, batch)
        grads[variant] = collect_grads(model)
    ref = grads["no checkpointing (upstream)"]
    agree = {v: compare_grads(ref, g).ok for v, g in grads.items()}
    times = {v: [] for v in WHISPER_VARIANTS}
    for _ in range(reps):
        for variant in WHISPER_VARIANTS:
            _use(model, variant)
            times[variant].append(workloads.step(model, batch))
    hotfix.activate()
    out = {v: summary(ts) for v, ts in times.items()}
    base = median(times["non-reentrant (upstream)"])
    out["ratio reentrant+hotfix / non-reentrant"] = median(times["reentrant + hotfix"]) / base
    out["ratio reentrant+hotfix / no checkpointing"] = median(times["reentrant + hotfix"]) / median(
        times["no checkpointing (upstream)"])
    out["gradients agree with no checkpointing"] = agree
    out["target"] = "reentrant+hotfix / non-reentrant <= 1.00"
    out["model"] = "Whisper d_model 384, 4+4 layers, vocab 51865, batch 2 x 3000 mel frames, 32 labels"
    return out


# ---------------------------------------------------------------------------- 5 memory
def bench_memory(reps, with_hotfix):
    import hotfix
    from hotfix_lab.bench import workloads

    model, batch = workloads.whisper_tiny()
    saved = {}
    for variant in WHISPER_VARIANTS:
        _use(model, variant)
        saved[variant] = workloads.saved_bytes(model, batch)
    hotfix.activate()
    out = {"saved for backward (MiB)": {v: round(r["saved"] / 2**20, 1) for v, r in saved.items()},
           "saved + checkpoint inputs (MiB)": {v: round(r["held"] / 2**20, 1) for v, r in saved.items()}}
    for kind in ("saved", "held"):
        re, nr, no = (saved[v][kind] for v in WHISPER_VARIANTS)
        out[f"ratio {kind} reentrant+hotfix / non-reentrant"] = re / nr
        out[f"ratio {kind} reentrant+hotfix / no checkpointing"] = re / no
    out["target"] = "/ non-reentrant <= 1.0 and / no checkpointing <= 0.5"
    out["note"] = ("saved: what saved_tensors_hooks see. Non-reentrant checkpointing keeps each layer's inputs "
                   "alive in its recompute closure, invisible to the hooks; reentrant saves the grad-requiring "
                   "ones with save_for_backward, where they count. held = saved + every tensor passed to a "
                   "checkpoint call, counted once per storage: the like-for-like figure")

    rss = {v: [] for v in WHISPER_VARIANTS}
    env = env_without_hotfix_vars()
    for _ in range(reps):
        for variant in WHISPER_VARIANTS:
            checkpointing = WHISPER_VARIANTS[variant][0]
            proc = subprocess.run([with_hotfix, "-P", "-m", "hotfix_lab.bench.workloads", "rss", checkpointing],
                                  env=env, capture_output=True, text=True, cwd=CHILD_CWD)
            if proc.returncode:
                raise RuntimeError(proc.stderr[-2000:])
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rss[variant].append((r["peak"] - r["before"]) / 2**20)
    out["peak RSS increase of one step (MiB, median of fresh processes)"] = {
        v: {"median": round(median(xs), 1), "min": round(min(xs), 1), "max": round(max(xs), 1)} for v, xs in rss.items()}
    rre, rnr, rno = (median(rss[v]) for v in WHISPER_VARIANTS)
    out["ratio peak RSS reentrant+hotfix / non-reentrant"] = rre / rnr if rnr else None
    out["ratio peak RSS reentrant+hotfix / no checkpointing"] = rre / rno if rno else None
    return out


