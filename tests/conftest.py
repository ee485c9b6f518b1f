"""Shared test plumbing: the tiers, the release matrix and fresh-interpreter runs.

Tiers (a marker each, from the folder):  unit/ in-process, seconds;  contract/ the
suite every fix runs through;  versions/ fixes across the release matrix and the
sweep's subsets;  e2e/ the product in fresh interpreters (start-up hook, CLI,
trainers, processes);  lab/ the laboratory's own tools (sweep, census, GPU kit).
support/ holds the tests' helpers and child scripts.

The suite runs against hotfix installed from a wheel in the test venv (see
scripts/test.sh), never the source tree, so what is tested is what users get.
Other library versions live side by side in .matrix/<name>-<version>/ and are
put first on PYTHONPATH of a child interpreter.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import pytest

from hotfix.diagnostics import children
from hotfix.diagnostics.children import child_env, json_lines  # noqa: F401  (tests import json_lines from here)
from hotfix.notice import REPAIR_NOTICE
from hotfix.startup.state import FINDER, WATCH

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TOOLS = REPO / "tools"  # what holds the lab package, hotfix_lab (the venv has it through a .pth; children get it here)
SUPPORT = TESTS / "support"  # the tests' own helpers and child scripts (layer_calls, stream sanitizer, ...)
sys.path.insert(0, str(SUPPORT))  # in-process tests import them as the children do

try:
    from hotfix_lab.infra import rank_results
    from hotfix_lab.infra.rank_results import free_port  # noqa: F401  (tests import free_port from here)
except ImportError as exc:  # a venv scripts/test.sh did not make: say the one step that is missing
    raise pytest.UsageError(f"the lab (tools/hotfix_lab) is not importable ({exc}): scripts/test.sh puts it on the test "
                            "venv's path, or once by hand: PYTHONPATH=tools python -P -m hotfix_lab.infra.pth") from exc

from warm_interpreter import WarmInterpreters  # noqa: E402  (support/, on sys.path above)

MATRIX = REPO / ".matrix"
IN_CI = bool(os.environ.get("CI"))
#: a folder where scripts/test.sh asks for the run's time log: one JSON line per test phase, and one per child
#: interpreter started through run_python (tools/hotfix_lab/bench/ci_time.py renders docs/ci-time.md from it)
CI_LOG = os.environ.get("HOTFIX_CI_LOG")
#: what a child that trains a transformers model imports first, in a fresh interpreter as in a warm one (``warm=``)
TRANSFORMERS_WARM = ("torch", "transformers", "transformers.modeling_utils")
#: what the lab's rank scripts import first (hotfix_lab.cases.ddp_cases, wrapper_cases)
DDP_WARM = ("torch", "torch.distributed", "transformers")
#: the servers children are forked from where a test names what they import first (``run_python(warm=...)``:
#: support/warm_interpreter.py); HOTFIX_TEST_WARM=0 starts every child fresh instead
WARM = WarmInterpreters(str(TESTS / "_scratch")) if os.environ.get("HOTFIX_TEST_WARM", "1") != "0" else None


def _ci_log(record: dict) -> None:
    import json

    folder = Path(CI_LOG)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{os.getpid()}.jsonl", "a") as handle:  # a file per process: no interleaved lines
        handle.write(json.dumps(record) + "\n")


def pytest_runtest_logreport(report) -> None:
    # pytest-xdist's workers report to the controller, which calls this hook again: log there only
    if CI_LOG and not os.environ.get("PYTEST_XDIST_WORKER"):
        _ci_log({"test": report.nodeid, "phase": report.when, "s": round(report.duration, 3),
                 "outcome": report.outcome})


def pytest_sessionfinish(session, exitstatus) -> None:
    if WARM is not None:
        WARM.close()


def _log_child(args: List[str], env: Dict[str, str], python: Optional[str], wall: float, warm: bool) -> None:
    """What CI's time log records of one child: which test, which interpreter and releases, upstream or hotfix."""
    entries = [Path(entry) for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    releases = sorted(entry.name for entry in entries if entry.parent == MATRIX)
    interpreter = Path(python or sys.executable)
    venv = interpreter.parent.parent
    what = next((Path(arg).name for arg in args if arg.endswith(".py")), None) or " ".join(args[:2])[:60]
    _ci_log({"child": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0], "wall_s": round(wall, 3),
             "python": venv.name if venv.parent in (REPO, MATRIX) else str(venv), "releases": releases,
             "upstream": env.get("HOTFIX_DISABLE", "").strip().lower() in ("1", "true", "yes", "on"),
             "what": what, "warm": warm})


def matrix_versions(name: str) -> List[str]:
    versions = []
    for line in (TESTS / "matrix.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and parts[0] == name:
            versions.append(parts[1])
    return versions


def matrix_path(name: str, version: str) -> Path:
    path = MATRIX / f"{name}-{version}"
    if not (path / ".complete").exists():
        no_disk = MATRIX / f"{name}-{version}.no-disk"  # a side torch the machine had no disk for (census.torch_venv)
        if no_disk.exists():
            pytest.skip(no_disk.read_text().strip())  # CI too: the machine's disk, not hotfix, is short
        message = f"{path} is not installed; run scripts/test.sh"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def run_sweep(tmp_path: Path, version: str, models: str, recipes: str, functions: str = "torch,unsloth",
              dtype: str = "float32") -> List[dict]:
    """The rows of a fresh ``hotfix_lab.sweep.sweep_models`` run on ``models`` (comma list) of one release (no census:
    these tests read the named models' rows only)."""
    import json

    matrix_path("transformers", version)
    if "unsloth" in functions:
        matrix_path("unsloth-zoo", "2026.10.9")  # tools/hotfix_lab/sweep/sweep_models.py UNSLOTH_ZOO
    results = tmp_path / "sweep.jsonl"
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "hotfix_lab.sweep.sweep_models", "--versions", version, "--models", models,
         "--recipes", recipes, "--functions", functions, "--dtype", dtype, "--fresh", "--no-census", "--jobs", "2",
         "--results", str(results), "--doc", str(tmp_path / "sweep.md")],
        capture_output=True, text=True, timeout=900, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    return [row for row in rows if not row["model_type"].startswith("__")]


def assert_sweep_cells(rows: List[dict], cells: int, upstream: Callable[[dict], bool]) -> None:
    """The sweep rows of a fix's reproduction: ``cells`` (function, recipe, hotfix) cells.  With hotfix each
    passes, its reentrant mode equal to no checkpointing; without, ``upstream(reentrant mode)`` holds; through
    torch's function non-reentrant checkpointing is exact in both halves."""
    by_cell = {(r["function"], r["recipe"], r["hotfix"]): r for r in rows}
    assert len(by_cell) == cells, sorted(by_cell)
    for (function, _recipe, hotfix), row in by_cell.items():
        reentrant = row["modes"]["reentrant"]
        if hotfix:
            assert row["result"] == "pass" and reentrant["status"] == "equal", row
        else:
            assert upstream(reentrant), row
        if function == "torch":
            assert row["modes"]["non-reentrant"]["status"] == "equal", row


def clean_env(extra: Optional[Dict[str, str]] = None, pythonpath: Iterable[Path] = ()) -> Dict[str, str]:
    """A child's environment: no HOTFIX_* settings, PYTHONPATH = the given paths, tests/, tests/support, tools/ (the lab)."""
    return child_env(keep_hotfix_settings=False, pythonpath=[*pythonpath, TESTS, SUPPORT, TOOLS], extra=extra)


def run_python(
    args: List[str],
    *,
    env: Optional[Dict[str, str]] = None,
    pythonpath: Iterable[Path] = (),
    cwd: Optional[Path] = None,
    timeout: float = 600,
    python: Optional[str] = None,
    warm: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a fresh interpreter of the test venv.

    cwd defaults to a directory outside the repository so that the source
    tree's ``hotfix/`` can never shadow the installed one.  ``warm``: the modules the child imports first, before
    anything it does could change what they do (``TRANSFORMERS_WARM``); named, the child is forked from an
    interpreter of the same environment that imported them already (support/warm_interpreter.py).  Never
    for a child whose subject is interpreter start or the order of imports.
    """
    child = clean_env(env, pythonpath)
    where = str(cwd or TESTS / "_scratch")
    start = time.monotonic()
    forked = None
    try:
        if warm and WARM is not None:
            forked = WARM.run(args, env=child, cwd=where, timeout=timeout, python=python or sys.executable, warm=warm)
        return forked or children.run_python(args, env=child, cwd=where, timeout=timeout, python=python)
    finally:
        if CI_LOG:
            _log_child(args, child, python, time.monotonic() - start, warm=forked is not None)


def launch_ranks(folder: Path, script: Union[Path, str], args: Sequence[str] = (), ranks: int = 2, *, disabled: bool = False,
                 env: Optional[Dict[str, str]] = None, pythonpath: Iterable[Path] = (),
                 timeout: float = 300, python: Optional[str] = None, warm: Sequence[str] = (),
                 ) -> Tuple[Dict[int, dict], subprocess.CompletedProcess]:
    """``ranks`` ranks of a rank script (``script FOLDER ARGS...``: hotfix_lab.infra.rank_results's protocol; a test's own
    file, or a module of the lab by name, e.g. "hotfix_lab.cases.ddp_cases"; 2: torchrun,
    1: rank 0 of 1, 0: a plain process) writing into ``folder`` (made here), on loopback, hotfix on or
    HOTFIX_DISABLE'd: ``({rank: its result}, the launcher's process)``.  Fails the test unless every rank wrote.
    ``python``: another interpreter than the test venv's (a side torch's venv).  ``warm``: as ``run_python``'s, for
    one rank or a plain process (torchrun's ranks are its own fresh interpreters)."""
    folder.mkdir(parents=True)
    target = ["-m", script] if isinstance(script, str) else [str(script)]
    argv, launch_env = rank_results.command([*target, str(folder), *args], ranks)
    launch_env.update(env or {}, **({"HOTFIX_DISABLE": "1"} if disabled else {}))
    proc = run_python(argv[1:], env=launch_env, pythonpath=pythonpath, timeout=timeout, python=python,
                      warm=warm if ranks < 2 else ())
    results = rank_results.read(folder)
    assert sorted(results) == list(range(max(ranks, 1))), (
        f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return results, proc


def dependencies(dest: Path) -> Path:
    """A folder with only hotfix's two dependencies (links to the test venv's), for ``python -S``."""
    import packaging
    import wrapt

    dest.mkdir()
    for module in (wrapt, packaging):
        (dest / module.__name__).symlink_to(Path(module.__file__).parent)
    return dest


def hotfix_lines(stderr: str) -> List[str]:
    """hotfix's problem lines on stderr (each starts with 'hotfix:'), without its once-per-process repair notice."""
    return [line for line in stderr.splitlines() if line.startswith("hotfix:") and not line.startswith(REPAIR_NOTICE)]


def repair_notices(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if line.startswith(REPAIR_NOTICE)]


#: the test tiers, one folder each (``pytest -m unit`` from a checkout runs in seconds); lab/ tests the
#: laboratory's own tools (sweep, census, GPU kit), not the product
TIERS = ("unit", "contract", "versions", "e2e", "lab")


def pytest_collection_modifyitems(config, items):
    """Mark each test with its tier: the folder under tests/ it lives in."""
    for item in items:
        relative = Path(str(item.fspath)).resolve().relative_to(TESTS)
        tier = relative.parts[0] if len(relative.parts) > 1 else None
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


def apply_again(patch) -> None:
    """``patch`` applied again to each of its targets already imported (after an in-process test reverted it)."""
    for name in patch.targets:
        if name in sys.modules:
            patch.apply(sys.modules[name])
    assert patch.applied, patch.name


@contextlib.contextmanager
def reverted(patch):
    """``patch`` reverted for the block (upstream, in the test process), applied again after it."""
    patch.revert()
    try:
        yield
    finally:
        apply_again(patch)


@contextlib.contextmanager
def checkout_build():
    """Held while a test builds hotfix in the checkout itself (setuptools' build/ and egg-info folders there:
    scripts/gpu/build-carry's wheel, the packaging test's editable install).  scripts/test.sh runs test files on
    two pytest-xdist workers; two such builds at once would write the same folders."""
    (TESTS / "_scratch").mkdir(exist_ok=True)
    with open(TESTS / "_scratch" / "checkout-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session", autouse=True)
def _scratch_dir():
    (TESTS / "_scratch").mkdir(exist_ok=True)
    yield


def pytest_report_header(config):
    try:
        import hotfix

        where = hotfix.__file__
    except Exception as exc:  # pragma: no cover
        where = f"not importable: {exc!r}"
    return [f"hotfix under test: {where}"]


CRASH = "Trying to backward through the graph a second time"  # the seed reports' error

# Prepended to child scripts that train.  It must not import hotfix: several
# children prove that hotfix is (or is not) loaded by transformers' import alone.
# The model and the gradient comparison come from hotfix/diagnostics/, loaded by
# path through the lab (hotfix_lab.infra: tiny_models, standalone), which import no hotfix.
#: a child's test (source text) for the start-up hook's finder in sys.meta_path (its class names: hotfix_state's, held
#: to the hook's by tests/unit/test_state_constants.py)
FINDER_ARMED = f"any(type(f).__name__ in {(WATCH, FINDER)!r} for f in sys.meta_path)"

PRELUDE = textwrap.dedent(
    '''
    import json, os, sys

    def boot_armed():
        """Is the .pth finder waiting for transformers in sys.meta_path?"""
        return FINDER_ARMED

    def tiny_whisper(seed=0):
        from hotfix_lab.infra import tiny_models  # tools/ is on the child's PYTHONPATH

        return tiny_models.whisper(seed)

    def compare():
        from hotfix_lab.infra import standalone

        return standalone.load("compare")  # hotfix's one comparison rule, without importing hotfix

    def grads(model):
        return compare().collect_grads(model)

    def reference_grads(model, batch):
        """Gradients of one step without checkpointing (call before enabling it)."""
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        return grads(model)

    def step(model, batch, reference=None):
        """One training step: {"ok": True[, "grads_match": ...]} or {"ok": False, "error": ...}."""
        model.zero_grad(set_to_none=True)
        try:
            model(**batch).loss.backward()
        except Exception as exc:
            return {"ok": False, "error": compare().short_error(exc)}
        result = {"ok": True}
        if reference is not None:
            result["grads_match"] = compare().compare_grads(reference, grads(model)).ok
        return result

    def layer_checkpoint_function(model):
        """What transformers stored on a layer (instance __dict__, not the descriptor)."""
        return model.model.decoder.layers[0].__dict__.get("_gradient_checkpointing_func")

    def report(**values):
        print(json.dumps(values), flush=True)
    '''
).replace("FINDER_ARMED", FINDER_ARMED)


def run_child(body: str, **kwargs):
    """Run PRELUDE + body in a fresh interpreter; return (process, first JSON line)."""
    proc = run_python(["-c", PRELUDE + textwrap.dedent(body)], timeout=300, **kwargs)
    assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = json_lines(proc.stdout)
    assert lines, f"child printed no JSON:\n{proc.stdout}\n{proc.stderr}"
    return proc, lines[0]


def plugin_dir(tmp_path: Path, name: str, modules: dict, entry_points: str) -> Path:
    """A third-party distribution on disk: modules + a dist-info with hotfix.patches entry points."""
    for relative, text in modules.items():
        (tmp_path / relative).write_text(textwrap.dedent(text))
    info = tmp_path / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hotfix.patches]\n" + textwrap.dedent(entry_points))
    return tmp_path


def _grads_of(model, x, checkpointing):
    """Gradients of one backward of ``model(x)`` (``x`` a fresh leaf that needs grad), with or without checkpointing."""
    from hotfix.diagnostics.compare import collect_grads

    model.zero_grad(set_to_none=True)
    model.checkpointing = checkpointing
    model(x.clone().requires_grad_(True)).backward()
    return collect_grads(model)


@pytest.fixture
def grads_of():
    """In-process gradient comparisons (tests/unit): ``grads_of(model, x, checkpointing)``."""
    return _grads_of
