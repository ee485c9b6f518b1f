"""Benchmarks 1-3: interpreter start-up, first-import activation, hotfix installed vs not; a first import with
a large ``sys.path`` (issue 40, defect 2: the start-up hook's scan for third-party fixes)."""

from __future__ import annotations

import json
import os
import subprocess

from hotfix_lab.bench.bench_common import CHILD_CWD, env_without_hotfix_vars, interleaved_processes, median, summary


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
    # a torch-only process: the start-up hook puts its watch on torch's DDP after torch's import (issue 50, part 4)
    torch_times = interleaved_processes({
        "import torch, not installed": ([without, "-c", "import torch"], env),
        "import torch, installed": ([with_hotfix, "-c", "import torch"], env),
    }, reps, warmup=2)
    out.update({name: summary(ts) for name, ts in torch_times.items()})
    out["ratio import torch installed / not installed"] = (median(torch_times["import torch, installed"])
                                                           / median(torch_times["import torch, not installed"]))
    out["target import torch"] = "<= 1.05"
    counts = {name: instructions(*variant) for name, variant in {
        "import torch, not installed": ([without, "-c", "import torch"], env),
        "import torch, installed": ([with_hotfix, "-c", "import torch"], env)}.items()}
    if all(counts.values()):  # valgrind is there: the same ratio in instructions, which noise does not move
        out["import torch instructions"] = counts
        out["import torch instructions installed / not installed"] = (counts["import torch, installed"]
                                                                      / counts["import torch, not installed"])
    return out


# ---------------------------------------------------------------------------- 1b a large sys.path
#: the two shapes of sys.path measured: a folder of this many files on PYTHONPATH, and this many path entries
BIG_FOLDER_FILES = 100_000
PATH_ENTRIES = 5_000


def _big_paths():
    """(a folder holding BIG_FOLDER_FILES files, PATH_ENTRIES empty folders as short paths relative to the children's
    working folder: 5,000 absolute paths would pass the kernel's limit on one environment string), made once."""
    folder, entries = CHILD_CWD / "big-folder", [f"p/{i}" for i in range(PATH_ENTRIES)]
    if not (CHILD_CWD / "big-path.complete").exists():
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(BIG_FOLDER_FILES):
            (folder / f"data_{i:06d}.bin").touch()
        for entry in entries:
            (CHILD_CWD / entry).mkdir(parents=True, exist_ok=True)
        (CHILD_CWD / "big-path.complete").touch()
    return folder, entries


#: the first imports measured: a standard-library module (the hook passes it over), and a small module outside it
#: (where the hook looks for third-party fixes' metadata on sys.path)
FIRST_IMPORTS = ("json", "packaging")


def bench_startup_path(reps, venvs):
    """``python -c "import M"`` in the venv with hotfix, on and off (HOTFIX_DISABLE=1), with a large sys.path."""
    with_hotfix, _ = venvs
    folder, entries = _big_paths()
    out = {}
    for label, pythonpath in ((f"a {BIG_FOLDER_FILES:,}-file folder on PYTHONPATH", [folder]),
                              (f"{PATH_ENTRIES:,} PYTHONPATH entries", entries)):
        env = dict(env_without_hotfix_vars(), PYTHONPATH=os.pathsep.join(map(str, pythonpath)))
        for module in FIRST_IMPORTS:
            argv = [with_hotfix, "-c", f"import {module}"]
            variants = {"HOTFIX_DISABLE=1": (argv, {**env, "HOTFIX_DISABLE": "1"}), "hotfix on": (argv, env)}
            times = interleaved_processes(variants, reps, warmup=2)
            key = f"{label}, import {module}"
            out[key] = {name: summary(ts) for name, ts in times.items()}
            out[key]["ratio on / off"] = median(times["hotfix on"]) / median(times["HOTFIX_DISABLE=1"])
            counts = {name: instructions(*variant) for name, variant in variants.items()}
            if all(counts.values()):  # valgrind is there: the same ratio in instructions, which noise does not move
                out[key]["instructions"] = counts
                out[key]["instructions on / off"] = counts["hotfix on"] / counts["HOTFIX_DISABLE=1"]
    out["target"] = "<= 1.05"
    return out


def instructions(argv, env):
    """The instructions one run of ``argv`` executes (valgrind's callgrind: the same count run after run,
    whatever else the machine does), or None without valgrind."""
    import re
    import shutil

    if shutil.which("valgrind") is None:
        return None
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], env=env,
                          capture_output=True, text=True, cwd=CHILD_CWD, timeout=600)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    return int(found.group(1)) if proc.returncode == 0 and found else None


# ---------------------------------------------------------------------------- 2 activation
ACTIVATION_PROBE = r"""
import sys, time, json
if sys.argv[1] == "preload-torch":
    import torch  # modeling_whisper imports it anyway; keeps its import out of hotfix's account
spent = {"activation": 0.0, "apply": 0.0, "finders": 0.0}
boot = [f for f in sys.meta_path if type(f).__name__ in ("FirstImportWatch", "ActivateOnFirstImport")][0]
if type(boot).__name__ == "FirstImportWatch":
    boot = boot.take_over()  # the activating finder, as the first import outside the standard library makes it
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


