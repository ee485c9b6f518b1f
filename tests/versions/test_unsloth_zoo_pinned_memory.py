"""unsloth-zoo-pinned-memory: unsloth's offload set-up where pinned host memory is refused (issue 50).

``initialize_unsloth_gradient_checkpointing`` of the real releases (loaded on CPU by hotfix_lab.infra.zoo_loader), called
as unsloth calls it.  A CPU-only torch refuses every pinned allocation ("pin_memory=True requires a CUDA or other
accelerator backend"), which is what a system short of page-locked memory does to cudaHostAlloc (WSL2: "CUDA error:
out of memory", unslothai/unsloth-zoo#1257): upstream the set-up raises; with hotfix it finishes, its 200 host
buffers pageable, and one "repaired" line names the fix.  2026.9.5 falls back itself: nothing to do there.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import json_lines, matrix_path, repair_notices, run_python

FIX = "unsloth-zoo-pinned-memory"
CHILD = r"""
import json, sys
import hotfix  # inert under HOTFIX_DISABLE=1
import torch
from hotfix_lab.infra import zoo_loader
gc = zoo_loader.load_release()
try:
    gc.initialize_unsloth_gradient_checkpointing(torch.float32)
    buffers = gc.CPU_BUFFERS
    row = {"ok": True, "buffers": len(buffers), "pinned": sum(b.is_pinned() for b in buffers),
           "torch_is_torch": gc.torch is torch}
except RuntimeError as exc:
    row = {"ok": False, "error": str(exc).splitlines()[0][:200], "torch_is_torch": gc.torch is torch}
print(json.dumps(row))
"""


def _run(version, hotfix):
    proc = run_python(["-c", CHILD], env={} if hotfix else {"HOTFIX_DISABLE": "1"},
                      pythonpath=[matrix_path("unsloth-zoo", version)], timeout=300)
    rows = json_lines(proc.stdout)
    assert len(rows) == 1, proc.stdout + proc.stderr[-3000:]
    return rows[0], repair_notices(proc.stderr)


@pytest.mark.parametrize("version", ["2025.11.3", "2026.8.9"])
def test_the_set_up_falls_back_to_pageable_memory(version):
    with ThreadPoolExecutor(2) as pool:
        (upstream, quiet), (fixed, notices) = pool.map(lambda on: _run(version, on), (False, True))
    assert not upstream["ok"] and "pin_memory=True requires" in upstream["error"], upstream
    assert quiet == []
    assert fixed == {"ok": True, "buffers": 200, "pinned": 0, "torch_is_torch": True}, fixed
    assert len(notices) == 1 and FIX in notices[0] and "pinned host memory was refused" in notices[0], notices
