"""The lab on a venv's path: a path configuration file (.pth) naming tools/, in the venv's site-packages.

    PYTHONPATH=tools python -P -m hotfix_lab.infra.pth     # once per venv (scripts/test.sh does it for the test venv)

From then on that venv's python runs the lab's modules (``python -P -m hotfix_lab...``) from any folder and imports
them in tests; no module of the lab edits sys.path.  The census's torch venvs get one the same way.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from hotfix_lab.infra.paths import TOOLS

#: the path configuration file that puts TOOLS on the venv's sys.path
PTH_NAME = "hotfix_lab.pth"


def install_pth() -> Path:
    """Write PTH_NAME into this interpreter's site-packages (run by the venv's own python); the file written."""
    target = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text(f"{TOOLS}\n")
    return target


if __name__ == "__main__":
    print(f"hotfix_lab: {install_pth()}")
