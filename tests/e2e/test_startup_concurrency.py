"""The first ``import transformers`` never deadlocks against another thread's import.

The start-up hook used to import hotfix from inside its finder's ``find_spec``,
which Python calls under its global import lock: a thread importing ``re`` or
``importlib.metadata`` at that moment held a module lock hotfix needed and
waited for the global lock, and ``import transformers`` never returned (20/20
runs with ``importlib.metadata`` in the other thread).  Now the finder only
arms the trigger's loader and hotfix is activated from ``exec_module``,
outside the global lock (boot/_hotfix_boot.py).

Each trial is a fresh interpreter (only the first import of a trigger
activates): 1-3 threads start importing modules picked at random, the main
thread sleeps a random 0-4 ms and imports transformers.  A trial that does not
finish within its timeout is a hang.

Sizes (tests/support/statistical_size.py): 50 trials where the start-up code changed since its last full run
(or ``HOTFIX_FULL_SIZE=1``), else 20: the 10 exact reproductions (before the fix it hung in 20 of 20 runs, so 10
passing is the failing-without proof) and one trial per contending module (each randomized trial's first module
goes round the list), every module exercised either way.

Each trial imports ``importlib`` before its threads start.  Python 3.11-3.13 has
its own race (CPython gh-130094, fixed in 3.14): while one thread initializes
the package ``importlib``, another importing ``importlib.machinery`` (``inspect``
does, so ``wrapt`` does) loads an uninitialised second copy of
``importlib._bootstrap`` and every later ``importlib.import_module`` fails with
"name 'sys' is not defined".  It needs no hotfix, no site, no transformers
(``python -S`` and two threads reproduce it), so a trial must not depend on it.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

from conftest import run_python
from support.statistical_size import record_full_run, size_of

#: trials: 10 are the exact reproduction (it hung 20/20 before the fix), the rest randomized, each module at least once
FULL_TRIALS, CI_TRIALS = 50, 20
#: the code whose change calls for the full size: the start-up hook and its second half
GUARDS = ("hotfix/startup/*.py",)
TEST = "e2e/test_startup_concurrency.py"
TIMEOUT_S = 90

# Modules whose import contends with hotfix's own activation imports (re,
# importlib.metadata, email, logging, typing, wrapt, packaging) or is slow
# (numpy, torch: kept rare, they cost seconds of CPU per trial).
MODULES = {
    "importlib.metadata": 6, "email.message": 4, "logging": 4, "json": 3, "typing": 3, "re": 3,
    "packaging.version": 2, "wrapt": 2, "numpy": 1, "torch": 1,
}

TRIAL = r"""
import importlib, json, random, sys, threading, time  # importlib: see the module docstring
rng = random.Random(int(sys.argv[1]))
names = sys.argv[2].split(",")
threads = [threading.Thread(target=__import__, args=(name,), daemon=True) for name in names]
for t in threads:
    t.start()
time.sleep(rng.uniform(0.0, 0.004))
import transformers
for t in threads:
    t.join(60)
registry = sys.modules.get("hotfix.registry")
print(json.dumps({"active": bool(registry and registry.registry.active),
                  "threads_done": not any(t.is_alive() for t in threads)}))
"""


def _trial(seed: int):
    rng = random.Random(seed)
    population = list(MODULES)
    weights = [MODULES[name] for name in population]
    # the first module goes round the list (every module in any 10 consecutive trials), the others at random
    first = population[seed % len(population)]
    names = sorted({first, *rng.choices(population, weights, k=rng.randint(0, 2))})
    if seed < 10:
        names = ["importlib.metadata"]  # the reported reproduction, exactly
    try:
        proc = run_python(["-c", TRIAL, str(seed), ",".join(names)], env={"OMP_NUM_THREADS": "1"}, timeout=TIMEOUT_S)
    except Exception as exc:  # subprocess.TimeoutExpired: the hang
        return seed, names, f"HANG ({type(exc).__name__})"
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    if proc.returncode != 0 or '"active": true' not in last[0] or '"threads_done": true' not in last[0]:
        return seed, names, f"rc={proc.returncode} out={last[0]!r} err={proc.stderr[-400:]!r}"
    return seed, names, None


def test_first_transformers_import_never_hangs_with_concurrent_imports():
    """50 (CI: 20) trials, 10 of them the exact reported reproduction: every
    one finishes, with hotfix active and every background import done."""
    size = size_of(TEST, CI_TRIALS, FULL_TRIALS, GUARDS)
    print(f"{size.trials} trials: {size.why}")
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(_trial, range(size.trials)))
    failures = [r for r in results if r[2] is not None]
    assert failures == [], failures[:5]
    covered = {name for _, names, _ in results for name in names}
    assert covered == set(MODULES), covered  # every contending module was exercised
    if size.full:
        record_full_run(TEST, GUARDS)
