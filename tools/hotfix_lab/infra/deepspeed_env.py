"""The environment of a DeepSpeed run on the CPU (its CPU accelerator, gloo on loopback), for every launcher.

The DeepSpeed census (hotfix_lab.census.deepspeed_census), the e2e test (tests/e2e/test_deepspeed.py), the one-process
shared-mapping test and the memory benchmark launch DeepSpeed from .matrix/deepspeed-<version>; each takes these
variables from here, so one rule holds for all.  Imports nothing heavy (no torch, no DeepSpeed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

from hotfix_lab.infra import rank_results  # tools/hotfix_lab, beside this file


def extensions(release: Path, torch_version: str) -> Path:
    """Torch's extensions folder for one DeepSpeed release (its folder) and one torch release.  DeepSpeed's CPU
    accelerator builds ``deepspeed_shm_comm`` by name there at start-up; in torch's shared default, two releases (or
    two torches) load each other's build ("module 'deepspeed_shm_comm' has no attribute 'vector_kernel_level'")."""
    return release / ".torch_extensions" / f"torch{torch_version.split('+')[0]}"


def cpu_env(release: Path, torch_version: str) -> Dict[str, str]:
    """The variables a process running DeepSpeed ``release`` on the CPU needs (torchrun adds the ranks' own)."""
    return {**rank_results.LOOPBACK, "DS_ACCELERATOR": "cpu",
            "TORCH_EXTENSIONS_DIR": str(extensions(release, torch_version))}


def stand_in_host_copy() -> None:
    """Make DeepSpeed's ``cpu_checkpointing`` host copy a tensor of its own, as an accelerator's is (call it after
    ``import deepspeed``, on its CPU accelerator only).

    There ``copy_to_device(args, torch.device("cpu"))`` returns each input itself (``item.to("cpu")``), which
    DeepSpeed then empties after the layer's forward: every model fails, with hotfix or without.  On a GPU the host
    copy is another tensor and only the inputs the layers share are lost (issue 50).  The call that makes the host
    copy (its device a ``torch.device``; the accelerator's copy names its device by a string) clones."""
    import torch
    from deepspeed.runtime.activation_checkpointing import checkpointing

    copy_to_device = checkpointing.copy_to_device
    if getattr(copy_to_device, "stands_in", False):
        return

    def host_copy(item, device, criterion_func):
        copied = copy_to_device(item, device, criterion_func)
        if isinstance(device, torch.device) and isinstance(copied, (tuple, list)):
            return type(copied)(x.clone() if criterion_func(x) else x for x in copied)
        return copied

    host_copy.stands_in = True
    checkpointing.copy_to_device = host_copy
