"""What every census tool shares (census, and the side censuses through side.py).

* ``install``: a release side by side into .matrix/<name>-<version> (git-ignored), once (hotfix_lab.infra.
  matrix_install, the test matrix's installer; a lock lets two jobs of one release install it once);
* ``torch_release``: the torch being measured (its rows record it);
* ``RowSink``: a row, stamped with that torch and today's date, appended to the run's pending file (a run
  that stops resumes from it) and printed as it comes;
* ``run_jobs``: the jobs on a thread pool, one failing job one line;
* ``add_store_arguments``: the options every side census has (side.py: its cycle, measure what the rows lack,
  compact them into the tracked store, render the page).

A tool brings its cells, its row key and store group, and its page; nothing here keeps state between calls
except the lock that lets two jobs of one release install it once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional

from hotfix_lab.infra import matrix_install
from hotfix_lab.infra.paths import TOOLS
from hotfix_lab.sweep import sweep_store

MATRIX = matrix_install.MATRIX
_INSTALLING = threading.Lock()  # jobs of one release run side by side: one installs, the other waits


def install(name: str, version: str) -> Path:
    """``name==version`` in .matrix/<name>-<version>, once: hotfix_lab.infra.matrix_install's rules (the test matrix's)."""
    with _INSTALLING:
        return matrix_install.install(name, version)


def lab_rank(script: str, cases: List[str], hotfix: bool, paths: List[Path], timeout: float) -> tuple:
    """hotfix_lab.cases.``script`` in one process as gloo rank 0 of 1 (loopback), hotfix off or on: (its rank0.json's
    content or None, why there is none)."""
    import tempfile

    from hotfix_lab.infra import rank_results
    from hotfix.diagnostics.children import child_env, last_line, run_python

    with tempfile.TemporaryDirectory() as out:
        command, extra = rank_results.command(["-m", f"hotfix_lab.cases.{script}", out, *cases], ranks=1)
        env = child_env(hotfix, keep_hotfix_settings=False, pythonpath=[*paths, TOOLS], extra=extra)
        proc = run_python(command[1:], env=env, cwd=Path("/tmp"), timeout=timeout)
        found = rank_results.read(Path(out)).get(0)
    return found, "" if found else f"exit {proc.returncode}: {last_line(proc)[:200]}"


def torch_release() -> str:
    """This interpreter's torch release, without its local part (2.14.1, not 2.14.1+cu130)."""
    import torch

    return torch.__version__.split("+")[0]


def read_rows(results: Path) -> List[Dict]:
    """Every row of a store (tracked rows and a run's pending ones) or of a .jsonl file."""
    return [json.loads(line) for line in sweep_store.read_lines(results)]


class RowSink:
    """Called with each row as a job makes it: stamps it (``torch``, ``date``, ``extra``), appends it to the
    pending file of ``results`` and prints ``describe(row)``.  Jobs on several threads share one sink."""

    def __init__(self, results: Path, torch: str, describe: Callable[[Dict], str], extra: Optional[Dict] = None):
        self.target = sweep_store.append_target(results)
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.stamp = dict(extra or {}, torch=torch, date=datetime.date.today().isoformat())
        self.describe = describe
        self.lock = threading.Lock()

    def __call__(self, row: Dict) -> None:
        row.update(self.stamp)
        with self.lock:
            with self.target.open("a") as handle:
                handle.write(json.dumps(row, sort_keys=True) + "\n")
            print(self.describe(row), flush=True)


def run_jobs(jobs: List[Callable[[], None]], workers: int, tool: str = "census") -> None:
    """Run ``jobs`` (emptied) on ``workers`` threads; one that fails is one line, the others go on."""
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for future in [pool.submit(job) for job in jobs]:
            try:
                future.result()
            except Exception as exc:  # one release failing to install or run must not stop the census
                print(f"{tool}: {exc!r}", flush=True)
    jobs.clear()


def add_store_arguments(parser: argparse.ArgumentParser, store: Path, doc: Path, timeout: float,
                        timeout_help: str) -> None:
    """The options every side census has: --jobs, --results, --doc, --render-only, --timeout."""
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--results", default=str(store), help="store directory, or a .jsonl file (tests)")
    parser.add_argument("--doc", default=str(doc))
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
