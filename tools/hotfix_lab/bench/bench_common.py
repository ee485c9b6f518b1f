"""What every benchmark shares: statistics, the machine line, the two throwaway venvs, timed children."""

from __future__ import annotations

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

from hotfix_lab.infra.paths import LAB

BENCH = LAB / "bench"  # its results/ folder (git-ignored)

# Children run outside the checkout, so that its hotfix/ source tree never shadows the installed one.
CHILD_CWD = Path(os.environ.get("HOTFIX_BENCH_DIR", "/tmp/hotfix-bench"))
HOTFIX_ENTRIES = ("hotfix", "_hotfix_boot.py", "hotfix_state.py", "hotfix-checkpoint.pth", "hotfix-checkpoint.start")


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
    from hotfix.diagnostics.children import child_env

    return child_env(keep_hotfix_settings=False, pythonpath=[])


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


