#!/usr/bin/env python3
"""Add a new transformers or unsloth-zoo release to every census, in one command.

    python -P -m hotfix_lab.census.add_release              # re-read PyPI, measure every release no census has, render
    python -P -m hotfix_lab.census.add_release --dry-run    # say what it would measure, measure nothing
    python -P -m hotfix_lab.census.add_release --no-refresh # the releases already in pypi-releases.json

1. PyPI's upload dates are read again (``releases.refresh``, into tools/hotfix_lab/census/pypi-releases.json): a new minor
   line of transformers joins the census span by itself (``releases.last_line``), a new patch release replaces its
   line's last one, a new unsloth-zoo release is paired with the transformers line of its time.
2. What the rows lack: census transformers releases and unsloth-zoo releases without rows under a census torch
   (``releases.CENSUS_TORCHES``), census transformers releases without rows in the DDP census or (from 4.52)
   the wrapper census, unsloth-zoo releases without rows in zoo_nonreentrant.py's census (first census torch).
3. Under each census torch (2.13.0: this Python; the others: .matrix/torch-<version>, installed here when missing,
   hotfix from a wheel of this checkout): census.py for the new releases (``--dimension transformers`` and
   ``unsloth-zoo``), the bisect of each new release's line where it has several patch releases (``--bisect``),
   ddp.py, wrapper.py and zoo_nonreentrant.py for them; each tool renders its page.  Then docs/versions.md
   again (every torch's rows).
4. The tests that hold the pages to the rows and the declared ranges (tests/versions/test_version_gates.py,
   test_ddp_census.py, test_wrapper_census.py) then ask for exactly these rows: where a fix's declared range and a
   new release disagree, the gate test names the cell.

Cost, 2026-11-28, the 2-core CPU machine, transformers 5.24.0: about 4 minutes for its census cells per torch,
10 s per torch for the DDP cells, 30 s for the wrapper cells, plus a torch venv where one is missing (2 - 3
minutes, about 6 GB).  The torch lines (census.py --torch lines) stay on releases.TORCH_LINE_RELEASE: a new
transformers release is not measured under every torch line again.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from hotfix_lab.infra.paths import REPO

from packaging.version import Version

from hotfix_lab.census import census
from hotfix_lab.census import ddp
from hotfix_lab.census import releases
from hotfix_lab.census import runner
from hotfix_lab.census import wrapper
from hotfix_lab.census import zoo_nonreentrant

#: each census tool, as ``python -m`` runs it
CENSUS, DDP, WRAPPER, ZOO = (["-P", "-m", f"hotfix_lab.census.{name}"]
                            for name in ("census", "ddp", "wrapper", "zoo_nonreentrant"))
#: the stores of each census, each tool's own (rows are read here to find what is missing)
STORES = {"census": census.STORE, "ddp": ddp.STORE, "wrapper": wrapper.STORE,
          "zoo-nonreentrant": zoo_nonreentrant.STORE}


def missing(torch: str) -> Dict[str, List[str]]:
    """The census releases without rows under ``torch``, per tool: census transformers / unsloth-zoo, ddp, wrapper."""
    census_rows = [r for r in runner.read_rows(STORES["census"]) if r["torch"] == torch and not r.get("line")]
    have = {(r["dimension"], r["release"]) for r in census_rows}
    found = {"transformers": [v for v in releases.transformers_releases() if ("transformers", v) not in have],
             "unsloth-zoo": [z for z, _ in releases.zoo_releases() if ("unsloth-zoo", z) not in have],
             "zoo-nonreentrant": []}
    if torch == releases.CENSUS_TORCHES[0]:  # unsloth-zoo-nonreentrant-offload's census: under the first only
        pairs = {(r["release"], r["transformers"]) for r in runner.read_rows(STORES["zoo-nonreentrant"])
                 if r["verdict"] != "error"}
        found["zoo-nonreentrant"] = [z for z, _ in releases.zoo_releases()
                                     if any((z, t) not in pairs for t in zoo_nonreentrant.TRANSFORMERS)]
    for tool, first in (("ddp", None), ("wrapper", wrapper.FIRST)):
        measured = {r["release"] for r in runner.read_rows(STORES[tool]) if r["torch"] == torch}
        found[tool] = [v for v in releases.transformers_releases()
                       if v not in measured and (first is None or Version(v) >= Version(first))]
    return found


def python_for(torch: str) -> str:
    """This Python where it has ``torch``; else .matrix/torch-<torch>'s (installed where missing; its hotfix
    reinstalled from this checkout either way: census.py --install-torch)."""
    if runner.torch_release() == torch:
        return sys.executable
    subprocess.run([sys.executable, *CENSUS, "--install-torch", torch], check=True)
    return str(runner.MATRIX / f"torch-{torch}" / "bin" / "python")


def commands(torch: str, python: str, found: Dict[str, List[str]], jobs: int) -> List[List[str]]:
    """The tool runs that measure what ``found`` lacks under ``torch``."""
    out = []
    if found["transformers"]:
        listed = ",".join(found["transformers"])
        out.append([python, *CENSUS, "--dimension", "transformers", "--releases", listed, "--jobs", str(jobs)])
        several = [v for v in found["transformers"] if len(releases.line_of(v)) > 1]
        if several:
            out.append([python, *CENSUS, "--bisect", "--releases", ",".join(several), "--jobs", str(jobs)])
    if found["unsloth-zoo"]:
        out.append([python, *CENSUS, "--dimension", "unsloth-zoo", "--releases", ",".join(found["unsloth-zoo"]),
                    "--jobs", str(jobs)])
    for tool, module in (("ddp", DDP), ("wrapper", WRAPPER), ("zoo-nonreentrant", ZOO)):
        if found[tool]:
            out.append([python, *module, "--releases", ",".join(found[tool]), "--jobs", str(jobs)])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-refresh", action="store_true", help="do not re-read PyPI (pypi-releases.json as it is)")
    p.add_argument("--dry-run", action="store_true", help="say what would be measured; measure nothing")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    if not args.no_refresh:
        releases.refresh()
    print(f"add-release: transformers {releases.transformers_releases()[-1]} is the newest census release "
          f"(lines {'.'.join(map(str, releases.FIRST_LINE))} - {'.'.join(map(str, releases.last_line()))})", flush=True)
    todo = {torch: missing(torch) for torch in releases.CENSUS_TORCHES}
    for torch, found in todo.items():
        for tool, versions in found.items():
            if versions:
                print(f"add-release: torch {torch}, {tool}: {', '.join(versions)}", flush=True)
    if not any(versions for found in todo.values() for versions in found.values()):
        print("add-release: every census has rows for every release: nothing to measure", flush=True)
    if args.dry_run:
        return 0
    for torch, found in todo.items():
        if not any(found.values()):
            continue
        python = python_for(torch)
        for command in commands(torch, python, found, args.jobs):
            print("add-release: " + " ".join(Path(c).name if c == python else c for c in command), flush=True)
            subprocess.run(command, check=True, cwd=REPO)
    subprocess.run([sys.executable, *CENSUS, "--render-only"], check=True, cwd=REPO)
    print("add-release: done; then: bash scripts/test.sh -k 'census or gates' (the pages and the declared ranges "
          "against the rows)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
