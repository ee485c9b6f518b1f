"""Where the checkout's parts are, for the lab's modules (one place: the package's depth is counted here only)."""

from __future__ import annotations

from pathlib import Path

#: the checkout's root (tools/hotfix_lab/infra/paths.py is three folders below it)
REPO = Path(__file__).resolve().parents[3]
#: the folder that holds the hotfix_lab package: what a child interpreter needs on PYTHONPATH to run the lab
TOOLS = REPO / "tools"
#: the lab package's own folder (its data files: census/pypi-releases.json, gpu/unsloth-carry.txt, ...)
LAB = TOOLS / "hotfix_lab"
