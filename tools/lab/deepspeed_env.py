"""The environment of a DeepSpeed run on the CPU (its CPU accelerator, gloo on loopback), for every launcher.

The DeepSpeed census (tools/census/deepspeed.py), the e2e test (tests/e2e/test_deepspeed.py), the one-process
shared-mapping test and the memory benchmark launch DeepSpeed from .matrix/deepspeed-<version>; each takes these
variables from here, so one rule holds for all.  Imports nothing heavy (no torch, no DeepSpeed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import rank_results  # tools/lab, beside this file


def extensions(release: Path, torch_version: str) -> Path:
    """Torch's extensions folder for one DeepSpeed release (its folder) and one torch release.  DeepSpeed's CPU
    accelerator builds ``deepspeed_shm_comm`` by name there at start-up; in torch's shared default, two releases (or
    two torches) load each other's build ("module 'deepspeed_shm_comm' has no attribute 'vector_kernel_level'")."""
    return release / ".torch_extensions" / f"torch{torch_version.split('+')[0]}"


def cpu_env(release: Path, torch_version: str) -> Dict[str, str]:
    """The variables a process running DeepSpeed ``release`` on the CPU needs (torchrun adds the ranks' own)."""
    return {**rank_results.LOOPBACK, "DS_ACCELERATOR": "cpu",
            "TORCH_EXTENSIONS_DIR": str(extensions(release, torch_version))}
