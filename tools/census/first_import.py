#!/usr/bin/env python3
"""First-import census: is hotfix active in a process whose first import is another library, not transformers?

Each case is one line of CASES: the library (a release of tests/matrix.txt, installed side by side in .matrix/ by
tools/lab/matrix_install.py; "-": the venv's own, or none) and the statement a user's script starts with.  Each
runs in a fresh interpreter of the running venv (hotfix installed there, its start-up hook live, no ``import
hotfix``): the statement, then ``import transformers.modeling_utils`` (what building a model imports), then
``hotfix_state`` is asked what is applied *in that process*.  A spy finder ahead of every other records which
trigger names were looked up without being imported (``importlib.util.find_spec``, ``pkgutil``): the look-ups that
left hotfix off before 2026-11-29 (its finder armed on the first look-up, and only that spec's execution
activated).  Stand-ins (``unsloth``, ``unsloth_zoo``: the real ones need a GPU) are written by this tool.

    python tools/census/first_import.py [--only NAME,...] [--page docs/census/first-import.md]

Exit status 0 when every case has hotfix active with transformers' fixes applied; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, NamedTuple, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
import matrix_install  # noqa: E402  tools/lab

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "census" / "first-import.md"
#: applied by importing transformers.modeling_utils on every transformers line the matrix installs
EXPECTED = "transformers-checkpoint-layer-io"


class Case(NamedTuple):
    name: str
    library: str  # "name version" of tests/matrix.txt, or "-"
    statement: str


# One line a case.  A look-up in another thread / before a fork / by a finder ahead of hotfix's are written out here.
CASES = [Case(*(part.strip() for part in line.split("|"))) for line in """
trl                    | trl 1.16.0                   | from trl import SFTTrainer
diffusers              | diffusers 0.39.0             | import diffusers
diffusers-pipeline     | diffusers 0.39.0             | from diffusers import DiffusionPipeline
optimum                | optimum 2.3.0                | import optimum.utils
sentence-transformers  | sentence-transformers 5.7.0  | import sentence_transformers
peft                   | -                            | import peft
accelerate             | -                            | import accelerate
datasets               | datasets 5.0.1               | import datasets
evaluate               | evaluate 0.4.6               | import evaluate
lightning              | lightning 2.6.6              | import lightning
liger-kernel           | liger-kernel 0.8.5           | import liger_kernel.transformers
deepspeed              | deepspeed 0.19.8             | import deepspeed
bitsandbytes           | bitsandbytes 0.50.2          | import bitsandbytes
unsloth-check          | -                            | import importlib.util; importlib.util.find_spec("unsloth") and __import__("unsloth")
unsloth_zoo-check      | -                            | import importlib.util; importlib.util.find_spec("unsloth_zoo") and __import__("unsloth_zoo")
importlib.util         | -                            | import importlib.util; importlib.util.find_spec("transformers")
pkgutil.find_loader    | -                            | import pkgutil, warnings; warnings.simplefilter("ignore"); pkgutil.find_loader("transformers")
pkgutil.get_loader     | -                            | import pkgutil, warnings; warnings.simplefilter("ignore"); pkgutil.get_loader("transformers")
probe in a thread      | -                            | import importlib.util, threading; t = threading.Thread(target=importlib.util.find_spec, args=("transformers",)); t.start(); t.join()
probe before a fork    | -                            | import importlib.util, os; importlib.util.find_spec("transformers"); pid = os.fork(); pid and os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
finder ahead           | -                            | import importlib.machinery as m; sys.meta_path.insert(0, type("Ahead", (), {"find_spec": staticmethod(lambda n, p=None, t=None: m.PathFinder.find_spec(n, p) if n == "transformers" else None)})())
finder moved to end    | -                            | f = next(f for f in sys.meta_path if type(f).__name__ == "ActivateOnFirstImport"); sys.meta_path.remove(f); sys.meta_path.append(f)
""".strip().splitlines()]

# Measured 2026-11-29 with the start-up hook of 4c61667 (the finder armed on the first look-up), same venv and
# releases: the cases where hotfix was off for the whole process.  Every other case was active.
OFF_BEFORE = frozenset({"trl", "diffusers", "diffusers-pipeline", "optimum", "unsloth-check", "unsloth_zoo-check",
                        "importlib.util", "pkgutil.find_loader", "pkgutil.get_loader", "probe in a thread",
                        "probe before a fork", "finder ahead", "finder moved to end"})

# Stand-ins for libraries that refuse to import without a GPU: what matters is that they are triggers, and that
# unsloth imports transformers (as the real one does).
STAND_INS = {"unsloth/__init__.py": "import transformers\n", "unsloth_zoo/__init__.py": ""}

CHILD = r'''
import json, sys
TRIGGERS = ("transformers", "unsloth", "unsloth_zoo")
looked_up = []
class Spy:
    """Ahead of every finder: notes a trigger looked up outside an import statement."""
    def find_spec(self, name, path=None, target=None):
        caller = sys._getframe(1).f_back  # _find_spec's caller: an import statement's is _find_and_load_unlocked
        if name in TRIGGERS and name not in looked_up and caller.f_code.co_name != "_find_and_load_unlocked":
            looked_up.append(name)
        return None
sys.meta_path.insert(0, Spy())
exec(compile(STATEMENT, "<case>", "exec"))
imported_transformers = "transformers" in sys.modules
import transformers.modeling_utils
import hotfix_state
print("CENSUS " + json.dumps({"looked_up": looked_up, "imported_transformers": imported_transformers,
                              "active": hotfix_state.active(), "applied": sorted(hotfix_state.applied()),
                              "report": hotfix_state.report()}))
'''


def _library(case: Case) -> Optional[Path]:
    if case.library == "-":
        return None
    name, version = case.library.split()
    return matrix_install.folder_of(name, version)


def version_of(case: Case) -> str:
    return case.library.split()[1] if case.library != "-" else "-"


def run(case: Case, stand_ins: Path, timeout: float = 300) -> dict:
    """One case in a fresh interpreter: its row."""
    folder = _library(case)
    if folder is not None and not (folder / ".complete").exists():
        return {"case": case.name, "error": f"{folder} is not installed (tools/lab/matrix_install.py)"}
    paths = [str(p) for p in (folder, stand_ins) if p is not None]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HOTFIX_", "PYTHON"))}
    env.update(PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", f"STATEMENT = {case.statement!r}\n" + CHILD], capture_output=True,
                          text=True, env=env, cwd=str(stand_ins), timeout=timeout)
    lines = [line[7:] for line in proc.stdout.splitlines() if line.startswith("CENSUS ")]
    if proc.returncode != 0 or len(lines) != 1:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"case": case.name, "error": f"rc {proc.returncode}: {tail}"}
    return {"case": case.name, **json.loads(lines[0])}


def verdict(row: dict) -> str:
    if "error" in row:
        return "ERROR: " + row["error"]
    if row["active"] and EXPECTED in row["applied"]:
        return "active, fixes applied"
    return "NOT ACTIVE: " + row["report"]


def render(rows: List[dict]) -> str:
    by_name = {row["case"]: row for row in rows}
    lines = [
        "# First-import census: hotfix active whatever a script imports first",
        "",
        "Made by `python tools/census/first_import.py` (run by tests/e2e/test_first_import_census.py in CI, which",
        "renders this page again and fails where it differs). Each case is a fresh interpreter of the test venv",
        "(torch 2.13.0, transformers 4.56.2, hotfix installed from its wheel, no `import hotfix`): the statement,",
        "then `import transformers.modeling_utils`; `hotfix_state` then says what is applied in that process.",
        "\"looked up\": trigger names the process looked up without importing them before transformers (each left",
        "hotfix off for the whole process before 2026-11-29); \"imports transformers\": the statement itself did.",
        "\"4c61667\": the same case measured once (2026-11-29) with the start-up hook before this census.",
        "Release \"-\": the test venv's own library (peft, accelerate) or none. A new case is one line of `CASES` in the",
        "tool (a new library: also one line of tests/matrix.txt).",
        "",
        "Not measured: timm and open_clip (torchvision 0.28.0, PyPI's for torch 2.13, fails to load its operators on",
        "the CPU build of torch 2.13.0: \"operator torchvision::nms does not exist\"; no torchvision for it exists).",
        "",
        "| case | release | statement | looked up | imports transformers | 4c61667 | hotfix |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in CASES:
        row = by_name.get(case.name)
        if row is None:
            continue
        looked = ", ".join(row.get("looked_up") or []) or "-"
        imports = "yes" if row.get("imported_transformers") else "no"
        before = "OFF" if case.name in OFF_BEFORE else "active"
        lines.append(f"| {case.name} | {version_of(case)} | `{case.statement}` | {looked} | {imports} | {before} | "
                     f"{verdict(row)} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--only", help="comma list of case names")
    parser.add_argument("--page", type=Path, help="write the page here (default: print the rows only)")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    cases = [case for case in CASES if wanted is None or case.name in wanted]
    with tempfile.TemporaryDirectory() as scratch:
        stand_ins = Path(scratch)
        for relative, text in STAND_INS.items():
            (stand_ins / relative).parent.mkdir(parents=True, exist_ok=True)
            (stand_ins / relative).write_text(text)
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(lambda case: run(case, stand_ins), cases))
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.page:
        args.page.write_text(render(rows))
    return 0 if all(verdict(row) == "active, fixes applied" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
