"""Where the checkout's parts are, for the lab's modules (one place: the package's depth is counted here only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: the checkout's root (tools/hotfix_lab/infra/paths.py is three folders below it)
REPO = Path(__file__).resolve().parents[3]
#: the folder that holds the hotfix_lab package: what a child interpreter needs on PYTHONPATH to run the lab
TOOLS = REPO / "tools"
#: the lab package's own folder (its data files: census/pypi-releases.json, gpu/unsloth-carry.txt, ...)
LAB = TOOLS / "hotfix_lab"
#: the path configuration file that puts TOOLS on an interpreter's sys.path (what a developer's venv needs once)
PTH_NAME = "hotfix_lab.pth"


def install_pth(python: str = sys.executable) -> Path:
    """Write PTH_NAME into the site-packages of ``python``'s environment: from then on it runs the lab's modules
    (``python -P -m hotfix_lab...``) from any folder, and no module edits sys.path.  Returns the file written."""
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    target = Path(purelib) / PTH_NAME
    target.write_text(f"{TOOLS}\n")
    return target


if __name__ == "__main__":  # PYTHONPATH=tools python -P -m hotfix_lab.infra.paths: the lab on this venv's path
    print(f"hotfix_lab: {install_pth()}")
