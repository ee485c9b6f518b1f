"""hotfix benchmarks: what it costs, measured on this machine in one run.

    .venv-test/bin/python bench/run.py            # all benchmarks (~5-10 min on 2 busy cores)
    .venv-test/bin/python bench/run.py --quick    # fewer repetitions
    .venv-test/bin/python bench/run.py startup whisper   # a subset
    .venv-test/bin/python bench/run.py --threads 1 wrapper   # steadier on a shared machine

Run it with the test venv's interpreter (scripts/test.sh makes it: torch
2.13.0 CPU, transformers 4.56.2, hotfix installed from a wheel).  Every
benchmark runs its variants interleaved (A B A B ...) in the same run and
prints medians, the spread, and the ratio.  Results also go to
bench/results/<UTC time>.json (git-ignored).

Benchmarks
  startup     ``python -c pass`` with hotfix installed vs not installed
  activation  first ``import transformers.models.whisper.modeling_whisper``, same two environments,
              plus the time spent inside hotfix measured in-process
  wrapper     Bart training step with reentrant checkpointing, hotfix active vs reverted
              (a call path with nothing to lift), plus the per-call cost of the wrapper
  whisper     Whisper training step at whisper-tiny dimensions (d_model 384, 4+4 layers, random
              weights, CPU): reentrant + hotfix vs use_reentrant=False vs no checkpointing
  memory      bytes saved for backward during the forward (saved_tensors_hooks, deduplicated by
              storage) and peak-RSS increase of one step (fresh process per sample), same variants
  unsloth     unsloth-zoo offload path on CPU through the test seam (tools/zoo_loader.py): per step,
              bytes offloaded to host, layers offloaded, host allocations and step time, upstream
              (HOTFIX_DISABLE=1 / reverted) vs patched, on unsloth-zoo 2025.11.3, 2025.11.5, 2026.10.9
              (one child process per release; 1 torch thread unless --threads)

"hotfix installed vs not installed": two throwaway venvs (``python -m venv
--without-pip``, under $HOTFIX_BENCH_DIR, default /tmp/hotfix-bench) whose
site-packages hold symlinks to every entry of this venv's site-packages -
one with hotfix's files (package, boot module, .pth/.start, dist-info), one
without.  Same interpreter, same packages, same other .pth files; created in
about a second, reused by later runs, rebuilt when this venv changes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

# Children run outside the checkout, so that its hotfix/ source tree never shadows the installed one.
CHILD_CWD = Path(os.environ.get("HOTFIX_BENCH_DIR", "/tmp/hotfix-bench"))
HOTFIX_ENTRIES = ("hotfix", "_hotfix_boot.py", "hotfix-checkpoint.pth", "hotfix-checkpoint.start")


# ---------------------------------------------------------------------------- helpers
def median(xs):
    return statistics.median(xs)


def spread(xs):
    """Interquartile range as a fraction of the median (noise indicator)."""
    if len(xs) < 4:
        return (max(xs) - min(xs)) / median(xs)
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / median(xs)


def summary(xs, unit="ms", scale=1e3):
    return {"median": median(xs) * scale, "min": min(xs) * scale, "iqr_rel": spread(xs), "n": len(xs), "unit": unit}


def fmt(s):
    return f"{s['median']:9.2f} {s['unit']} (min {s['min']:.2f}, IQR {100 * s['iqr_rel']:.1f}%, n={s['n']})"


def load():
    return os.getloadavg()


def machine():
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    import transformers

    import hotfix

    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(), "platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__, "hotfix": hotfix.__version__,
        "loadavg_start": load(),
    }


def env_without_hotfix_vars():
    return {k: v for k, v in os.environ.items() if not k.startswith("HOTFIX_") and k not in ("PYTHONPATH",)}


# ---------------------------------------------------------------------------- venvs
def bench_venvs():
    """(python with hotfix, python without hotfix): symlink farms of this venv's site-packages."""
    site = Path(sysconfig.get_paths()["purelib"])
    if not (site / "_hotfix_boot.py").exists():
        raise SystemExit(f"hotfix is not installed in {site}; run with the test venv (scripts/test.sh)")
    root = CHILD_CWD
    root.mkdir(parents=True, exist_ok=True)
    stamp = json.dumps(sorted(p.name for p in site.iterdir()) + [sys.executable, str(site.stat().st_mtime)])
    pythons = {}
    for name, keep_hotfix in (("with-hotfix", True), ("without-hotfix", False)):
        venv = root / name
        python = venv / "bin" / "python"
        if not ((venv / ".stamp").exists() and (venv / ".stamp").read_text() == stamp):
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
            target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                         check=True, capture_output=True, text=True, cwd=CHILD_CWD).stdout.strip())
            def is_hotfix(name):
                return name in HOTFIX_ENTRIES or name.startswith(("hotfix_checkpoint-", "_hotfix_boot."))

            for entry in site.iterdir():
                if entry.name == "__pycache__" or (is_hotfix(entry.name) and not keep_hotfix):
                    continue
                (target / entry.name).symlink_to(entry)
            (target / "__pycache__").mkdir(exist_ok=True)  # compiled top-level modules, as pip left them
            for pyc in (site / "__pycache__").glob("*"):
                if keep_hotfix or not is_hotfix(pyc.name):
                    (target / "__pycache__" / pyc.name).symlink_to(pyc)
            (venv / ".stamp").write_text(stamp)
        pythons[name] = str(python)
    check = subprocess.run(
        [pythons["with-hotfix"], "-c", "import sys, torch, transformers; print(any(type(f).__name__ == "
         "'ActivateOnFirstImport' for f in sys.meta_path))"],
        capture_output=True, text=True, env=env_without_hotfix_vars(), cwd=CHILD_CWD)
    assert check.stdout.strip() == "True", check.stderr
    check = subprocess.run([pythons["without-hotfix"], "-c", "import torch, transformers, importlib.util, sys; "
                            "print(importlib.util.find_spec('hotfix') is None and '_hotfix_boot' not in sys.modules)"],
                           capture_output=True, text=True, env=env_without_hotfix_vars(), cwd=CHILD_CWD)
    assert check.stdout.strip() == "True", check.stderr
    return pythons["with-hotfix"], pythons["without-hotfix"]


def time_process(argv, env):
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=CHILD_CWD)
    elapsed = time.perf_counter() - started
    if proc.returncode:
        raise RuntimeError(f"{argv} failed: {proc.stderr[-2000:]}")
    return elapsed


def interleaved_processes(variants, reps, warmup=1):
    """variants: {name: (argv, env)}; returns {name: [seconds]} measured A B A B ..."""
    times = {name: [] for name in variants}
    for i in range(warmup + reps):
        for name, (argv, env) in variants.items():
            t = time_process(argv, env)
            if i >= warmup:
                times[name].append(t)
    return times


# ---------------------------------------------------------------------------- 1 startup
def bench_startup(reps, venvs):
    with_hotfix, without = venvs
    env = env_without_hotfix_vars()
    times = interleaved_processes({
        "not installed": ([without, "-c", "pass"], env),
        "installed": ([with_hotfix, "-c", "pass"], env),
        "installed, HOTFIX_DISABLE=1": ([with_hotfix, "-c", "pass"], {**env, "HOTFIX_DISABLE": "1"}),
    }, reps, warmup=3)
    out = {name: summary(ts) for name, ts in times.items()}
    out["ratio installed / not installed"] = median(times["installed"]) / median(times["not installed"])
    out["target"] = "<= 1.10"
    return out


# ---------------------------------------------------------------------------- 2 activation
ACTIVATION_PROBE = r"""
import sys, time, json
if sys.argv[1] == "preload-torch":
    import torch  # modeling_whisper imports it anyway; keeps its import out of hotfix's account
spent = {"activation": 0.0, "apply": 0.0, "finders": 0.0}
boot = [f for f in sys.meta_path if type(f).__name__ == "ActivateOnFirstImport"][0]
original_find_spec, original_activate = boot.find_spec, boot.activate

def timed_find_spec(name, path=None, target=None):
    t = time.perf_counter()
    try:
        return original_find_spec(name, path, target)
    finally:
        spent["finders"] += time.perf_counter() - t   # the boot finder: no-op checks, or arming the trigger

def timed_activate():
    t = time.perf_counter()
    try:
        return original_activate()                    # import hotfix + registry.activate()
    finally:
        spent["activation"] += time.perf_counter() - t
        import hotfix.patch as hp
        original_apply = hp.Patch.apply
        def timed_apply(self, module, **kw):
            t0 = time.perf_counter()
            try:
                return original_apply(self, module, **kw)
            finally:
                spent["apply"] += time.perf_counter() - t0
        hp.Patch.apply = timed_apply
        for finder in sys.meta_path:       # wrapt's and hotfix's finders: every later import asks them
            if type(finder).__module__.startswith(("wrapt", "hotfix")):
                def wrap(f=finder, fs=finder.find_spec):
                    def fs_timed(*a, **k):
                        t1 = time.perf_counter()
                        try:
                            return fs(*a, **k)
                        finally:
                            spent["finders"] += time.perf_counter() - t1
                    f.find_spec = fs_timed
                wrap()

boot.find_spec = timed_find_spec
boot.activate = timed_activate
t = time.perf_counter()
import transformers.models.whisper.modeling_whisper
total = time.perf_counter() - t
from hotfix.registry import registry
print(json.dumps({"total": total, **spent, "torch_preloaded": sys.argv[1] == "preload-torch",
                  "applied": sorted(n for n, p in registry.patches().items() if p.applied)}))
"""


def bench_activation(reps, venvs):
    with_hotfix, without = venvs
    env = env_without_hotfix_vars()
    argv = ["-c", "import transformers.models.whisper.modeling_whisper"]
    times = interleaved_processes({
        "not installed": ([without] + argv, env),
        "installed": ([with_hotfix] + argv, env),
    }, reps)
    out = {name: summary(ts) for name, ts in times.items()}
    plain = median(times["not installed"])
    out["ratio installed / not installed (end to end)"] = median(times["installed"]) / plain
    def probe(mode):
        proc = subprocess.run([with_hotfix, "-c", ACTIVATION_PROBE, mode], env=env, capture_output=True, text=True,
                              cwd=CHILD_CWD)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        return json.loads(proc.stdout.strip().splitlines()[-1])

    # As a user meets it, activation happens at `import transformers`, before
    # transformers has imported torch: what hotfix's own modules import then
    # (torch, if a patch imports it at module level) lands in its account.
    as_is = probe("as-is")
    out["in-process activation, torch not yet imported (ms)"] = 1e3 * as_is["activation"]
    probes = [probe("preload-torch") for _ in range(max(3, reps // 2))]
    inside = [p["activation"] + p["apply"] + p["finders"] for p in probes]
    out["in-process hotfix time (torch preloaded)"] = summary(inside)
    out["in-process parts (median ms)"] = {k: 1e3 * median([p[k] for p in probes]) for k in ("activation", "apply", "finders")}
    out["in-process share of the import without hotfix"] = median(inside) / plain
    out["patches applied"] = probes[0]["applied"]
    out["target"] = "<= 3 % added"
    return out


# ---------------------------------------------------------------------------- 3 wrapper
def bench_wrapper(reps):
    import torch

    import hotfix
    import hotfix.checkpoint_inputs as ci
    import workloads

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
    import workloads

    checkpointing, active = WHISPER_VARIANTS[variant]
    (hotfix.activate if active else hotfix.revert)()
    workloads.set_checkpointing(model, checkpointing)


def bench_whisper(reps):
    import torch

    import hotfix
    import workloads

    model, batch = workloads.whisper_tiny()
    grads = {}
    for variant in WHISPER_VARIANTS:  # warm-up, and the gradients agree across variants
        _use(model, variant)
        workloads.step(model, batch)
        grads[variant] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    ref = grads["no checkpointing (upstream)"]
    agree = {v: len(g) == len(ref) and all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(g, ref))
             for v, g in grads.items()}
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
    import workloads

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
            proc = subprocess.run([with_hotfix, str(BENCH / "workloads.py"), "rss", checkpointing],
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


# ---------------------------------------------------------------------------- 6 unsloth
UNSLOTH_RELEASES = ("2025.11.3", "2025.11.5", "2026.10.9")
UNSLOTH_NOTE = ("CPU only, through the test seam (tools/zoo_loader.py): the 'host' copies are CPU->CPU memcpy "
                "(hotfix: SimulatedDevice; upstream: its own offload branch with fake streams), so step times "
                "show Python/bookkeeping and memcpy overhead, not PCIe transfers or stream overlap; bytes, layers "
                "and allocations are what a GPU run would do")


def bench_unsloth(reps, threads=None):
    import workloads

    env = env_without_hotfix_vars()
    env["HOTFIX_DISABLE"] = "1"  # the child loads the release unpatched, then activates hotfix itself
    releases = {}
    for version in UNSLOTH_RELEASES:
        path = REPO / ".matrix" / f"unsloth-zoo-{version}"
        if not (path / ".complete").exists():
            print(f"  unsloth-zoo {version}: not installed under .matrix/ (scripts/test.sh installs it); skipped")
            continue
        env["PYTHONPATH"] = os.pathsep.join([str(path), str(REPO / "tools")])
        # One torch thread unless --threads says otherwise: the step is small, and on a shared
        # 2-vCPU machine two threads mostly measure contention (IQR > 100 % in trials).
        argv = [sys.executable, str(BENCH / "workloads.py"), "unsloth", str(reps), str(threads or 1)]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=CHILD_CWD)
        if proc.returncode:
            raise RuntimeError(f"unsloth-zoo {version}: {proc.stderr[-3000:]}")
        releases[version] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not releases:
        return {"status": "no unsloth-zoo release installed under .matrix/"}

    MiB = 2 ** 20
    out = {}
    lines = [f"  {'release':<10} {'variant':<9} {'step':>4} {'layers offl.':>12} {'MiB to host':>11} "
             f"{'host allocs':>11} {'msg':>3} {'step time (median)':>26} {'patched/upstream':>16}"]
    for version, r in releases.items():
        steps = len(r["results"]["upstream"][0])
        per = {}  # variant -> step -> dict
        for variant, runs in r["results"].items():
            per[variant] = []
            for k in range(steps):
                samples = [run[k] for run in runs]

                def one(key, samples=samples):  # counts are deterministic: say so if they ever vary
                    values = {s[key] for s in samples}
                    return values.pop() if len(values) == 1 else f"{min(values)}-{max(values)}"

                per[variant].append(dict(
                    time=summary([s["seconds"] for s in samples]), layers=one("layers"),
                    bytes_to_host=one("bytes_to_host"), bytes_to_device=one("bytes_to_device"),
                    host_allocs=one("host_allocs"), messages=one("messages"),
                    grads_exact=all(s["max_rel_error"] <= 1e-6 for s in samples),
                    max_rel_error=max(s["max_rel_error"] for s in samples)))
            per[variant].append(dict(time=summary([sum(s["seconds"] for s in run) for run in runs])))
        label = "patched" if r["offload_patch"] else "patched*"
        for variant, name in (("upstream", "upstream"), ("hotfix", label)):
            for k, st in enumerate(per[variant]):
                t = st["time"]
                ratio = per["hotfix"][k]["time"]["median"] / per["upstream"][k]["time"]["median"]
                ratio = f"{ratio:.3f}" if variant == "hotfix" else ""
                timing = f"{t['median']:8.1f} ms (IQR {100 * t['iqr_rel']:4.1f}%)"
                if k == steps:
                    lines.append(f"  {version:<10} {name:<9} {'all':>4} {'':>12} {'':>11} {'':>11} {'':>3} "
                                 f"{timing:>26} {ratio:>16}")
                    continue
                mib = st["bytes_to_host"] / MiB if isinstance(st["bytes_to_host"], int) else st["bytes_to_host"]
                lines.append(f"  {version:<10} {name:<9} {k + 1:>4} {str(st['layers']) + '/' + str(r['layers']):>12} "
                             f"{mib:>11.1f} {st['host_allocs']!s:>11} {st['messages']!s:>3} {timing:>26} "
                             f"{ratio:>16}")
        up, fx = per["upstream"], per["hotfix"]
        out[f"{version} ratio step time patched / upstream"] = {
            **{f"step {k + 1}": round(fx[k]["time"]["median"] / up[k]["time"]["median"], 3) for k in range(steps)},
            f"all {steps} steps": round(fx[steps]["time"]["median"] / up[steps]["time"]["median"], 3)}
        out[f"{version} MiB offloaded per step upstream / patched"] = [
            f"{up[k]['bytes_to_host'] / MiB:.0f} / {fx[k]['bytes_to_host'] / MiB:.0f}" for k in range(steps)]
        out[f"{version} gradients exact (both variants, every step)"] = all(
            st["grads_exact"] for v in (up, fx) for st in v[:steps])
        out[f"_{version}"] = dict(applied=r["applied"], minimum_size=r["minimum_size"], per_step=per)
    any_r = next(iter(releases.values()))
    print(f"  {any_r['layers']} checkpointed layers (rank-{workloads.ZOO_RANK} residual MLP blocks), input "
          f"{'x'.join(map(str, any_r['shape']))} fp32 = {workloads.ZOO_SHAPE[0] * workloads.ZOO_SHAPE[1] * workloads.ZOO_SHAPE[2] * 4 / MiB:.0f} MiB "
          f"per layer; UnslothCheckpointFunction.apply(layer, True, h), h requires grad; {workloads.ZOO_STEPS} steps "
          f"per training run, {reps} runs per variant interleaved (A B B A ...) after one warm-up run each; torch threads "
          f"{any_r['threads']}")
    print("  upstream: HOTFIX_DISABLE=1 / hotfix.revert(); patched: hotfix active (patched* = only the "
          "closure-tensor wrapper applies there: the release's own offload runs)")
    print("  msg: times 'Unsloth: Will smartly offload gradients to save VRAM!' was printed in that step")
    print("\n".join(lines))
    out["target"] = "patched offloads from step 1; step time patched / upstream <= 1.05 where both offload the same"
    out["note"] = UNSLOTH_NOTE
    return out


# ---------------------------------------------------------------------------- main
ALL = ("startup", "activation", "wrapper", "whisper", "memory", "unsloth")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("benchmarks", nargs="*", help="any of: " + " ".join(ALL) + " (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for the in-process benchmarks (default: torch's choice; "
                             "unsloth: 1); "
                             "1 is steadier on a shared machine")
    args = parser.parse_args(argv)
    chosen = args.benchmarks or list(ALL)
    unknown = sorted(set(chosen) - set(ALL))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(ALL)}")
    q = args.quick
    reps = {"startup": 10 if q else 30, "activation": 3 if q else 9, "wrapper": 5 if q else 15,
            "whisper": 3 if q else 7, "memory": 1 if q else 3, "unsloth": 5 if q else 11}

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    info = machine()
    print("hotfix benchmarks")
    for key, value in info.items():
        print(f"  {key}: {value}")
    results = {"machine": info}
    venvs = bench_venvs() if {"startup", "activation", "memory"} & set(chosen) else None
    for name in chosen:
        print(f"\n== {name}  (load average before: {' '.join(f'{x:.2f}' for x in load())})", flush=True)
        started = time.perf_counter()
        if name == "startup":
            out = bench_startup(reps[name], venvs)
        elif name == "activation":
            out = bench_activation(reps[name], venvs)
        elif name == "wrapper":
            out = bench_wrapper(reps[name])
        elif name == "whisper":
            out = bench_whisper(reps[name])
        elif name == "memory":
            out = bench_memory(reps[name], venvs[0])
        else:
            out = bench_unsloth(reps[name], args.threads)
        out["seconds"] = round(time.perf_counter() - started, 1)
        out["loadavg_after"] = load()
        results[name] = out
        for key, value in out.items():
            if key.startswith("_"):  # details: in the JSON file only
                continue
            if isinstance(value, dict) and "median" in value and "unit" in value:
                print(f"  {key:<34} {fmt(value)}")
            elif isinstance(value, float):
                print(f"  {key:<34} {value:.4f}")
            else:
                print(f"  {key:<34} {value}")
    info["loadavg_end"] = load()
    out_dir = BENCH / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / (_dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + ".json")
    path.write_text(json.dumps(results, indent=1))
    print(f"\nsaved {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
