#!/usr/bin/env python3
"""First-import census: is hotfix active in a process whose first import is another library, not transformers?

Each case is one line of CASES: the library (a release of tests/matrix.txt, installed side by side in .matrix/ by
hotfix_lab.infra.matrix_install; "-": the venv's own, or none) and the statement a user's script starts with.  Each
runs in a fresh interpreter of the running venv (hotfix installed there, its start-up hook live, no ``import
hotfix``): the statement, then ``import transformers.modeling_utils`` (what building a model imports), then
``hotfix_state`` is asked what is applied *in that process*.  A spy finder ahead of every other records which
trigger names were looked up without being imported (``importlib.util.find_spec``, ``pkgutil``): the look-ups that
left hotfix off before 2026-11-29 (its finder armed on the first look-up, and only that spec's execution
activated).  Stand-ins (``unsloth``, ``unsloth_zoo``: the real ones need a GPU) are written by this tool.

    python -P -m hotfix_lab.census.first_import [--only NAME,...] [--section all|main|side] [--page docs/census/first-import.md]

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

from hotfix_lab.infra import matrix_install
from hotfix_lab.infra.paths import REPO

PAGE = REPO / "docs" / "census" / "first-import.md"
#: applied by importing transformers.modeling_utils on every transformers line the matrix installs
EXPECTED = "transformers-checkpoint-layer-io"


class Case(NamedTuple):
    name: str
    library: str  # "name version" of tests/matrix.txt, or "-"; beside a side torch: the distribution's name
    statement: str
    #: "-": the running venv; a torch line: that side torch's venv (.matrix/torch-<line>) with the libraries
    #: matrix_install installs beside it (BESIDE_TORCH: torchvision exists for that torch only)
    torch: str = "-"


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
finder moved to end    | -                            | f = next(f for f in sys.meta_path if type(f).__name__ in ("FirstImportWatch", "ActivateOnFirstImport")); sys.meta_path.remove(f); sys.meta_path.append(f)
timm                   | timm                         | import timm                                      | 2.11.0
open_clip              | open_clip_torch              | import open_clip                                 | 2.11.0
""".strip().splitlines()]
#: the transformers release beside a side torch (tests/matrix.txt has it; the test venv's own)
SIDE_TRANSFORMERS = "4.56.2"
#: the cases of each page section: the test venv's, and those beside a side torch (run after it is installed)
MAIN = [case for case in CASES if case.torch == "-"]
SIDE = [case for case in CASES if case.torch != "-"]

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
    if case.torch != "-":
        return matrix_install.beside_torch_folder(case.torch)
    if case.library == "-":
        return None
    name, version = case.library.split()
    return matrix_install.folder_of(name, version)


def version_of(case: Case) -> str:
    if case.torch != "-":
        return next(spec.partition("==")[2] for spec in matrix_install.BESIDE_TORCH[case.torch]
                    if spec.partition("==")[0] == case.library)
    return case.library.split()[1] if case.library != "-" else "-"


def _python(case: Case) -> Path:
    return Path(sys.executable) if case.torch == "-" else matrix_install.MATRIX / f"torch-{case.torch}" / "bin" / "python"


def run(case: Case, stand_ins: Path, timeout: float = 300) -> dict:
    """One case in a fresh interpreter: its row."""
    folder = _library(case)
    if folder is not None and not (folder / ".complete").exists():
        return {"case": case.name, "error": f"{folder} is not installed (tools/hotfix_lab/infra/matrix_install.py)"}
    side = [matrix_install.folder_of("transformers", SIDE_TRANSFORMERS)] if case.torch != "-" else []
    paths = [str(p) for p in (folder, *side, stand_ins) if p is not None]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HOTFIX_", "PYTHON"))}
    env.update(PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([str(_python(case)), "-c", f"STATEMENT = {case.statement!r}\n" + CHILD],
                          capture_output=True, text=True, env=env, cwd=str(stand_ins), timeout=timeout)
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


def _table(cases: List[Case], by_name: dict) -> List[str]:
    lines = ["| case | release | statement | looked up | imports transformers | 4c61667 | hotfix |",
             "|---|---|---|---|---|---|---|"]
    for case in cases:
        row = by_name.get(case.name)
        if row is None:
            continue
        looked = ", ".join(row.get("looked_up") or []) or "-"
        imports = "yes" if row.get("imported_transformers") else "no"
        before = "OFF" if case.name in OFF_BEFORE else "active" if case in MAIN else "not measured"
        lines.append(f"| {case.name} | {version_of(case)} | `{case.statement}` | {looked} | {imports} | {before} | "
                     f"{verdict(row)} |")
    return lines


def render_main(rows: List[dict]) -> str:
    """The page's head and the test venv's table (tests/e2e/test_first_import_census.py checks it)."""
    lines = [
        "# First-import census: hotfix active whatever a script imports first",
        "",
        "Made by `python -P -m hotfix_lab.census.first_import` (run by tests/e2e/test_first_import_census.py in CI, which",
        "renders this page again and fails where it differs). Each case is a fresh interpreter of the test venv",
        "(torch 2.13.0, transformers 4.56.2, hotfix installed from its wheel, no `import hotfix`): the statement,",
        "then `import transformers.modeling_utils`; `hotfix_state` then says what is applied in that process.",
        "\"looked up\": trigger names the process looked up without importing them before transformers (each left",
        "hotfix off for the whole process before 2026-11-29); \"imports transformers\": the statement itself did.",
        "\"4c61667\": the same case measured once (2026-11-29) with the start-up hook before this census.",
        "Release \"-\": the test venv's own library (peft, accelerate) or none. A new case is one line of `CASES` in the",
        "tool (a new library: also one line of tests/matrix.txt).",
        "",
        *_table(MAIN, {row["case"]: row for row in rows}),
    ]
    return "\n".join(lines) + "\n"


def render_side(rows: List[dict]) -> str:
    """The section of the cases beside a side torch (checked by the side_torch test of the same file)."""
    lines = [
        "",
        "## Beside torch 2.11.0: timm and open_clip",
        "",
        "timm and open_clip import torchvision, and PyPI has no torchvision for the test venv's CPU torch 2.13.0",
        "(torchvision 0.28.0, built for torch 2.13: \"operator torchvision::nms does not exist\"). These cases run in",
        "the side venv of torch 2.11.0 (PyPI's build, on the CPU; hotfix from the same wheel; transformers",
        f"{SIDE_TRANSFORMERS} from .matrix/), their libraries beside it (tools/hotfix_lab/infra/matrix_install.py BESIDE_TORCH, with",
        "PyPI's torchvision for that torch). Not measured before this census (\"not measured\").",
        "",
        *_table(SIDE, {row["case"]: row for row in rows}),
    ]
    return "\n".join(lines) + "\n"


def render(rows: List[dict]) -> str:
    return render_main(rows) + render_side(rows)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--only", help="comma list of case names")
    parser.add_argument("--section", choices=("all", "main", "side"), default="all",
                        help="the test venv's cases, those beside a side torch, or both (default)")
    parser.add_argument("--page", type=Path, help="write the page (its section) here (default: print the rows only)")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    section = {"all": CASES, "main": MAIN, "side": SIDE}[args.section]
    cases = [case for case in section if wanted is None or case.name in wanted]
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
        args.page.write_text({"all": render, "main": render_main, "side": render_side}[args.section](rows))
    return 0 if all(verdict(row) == "active, fixes applied" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
