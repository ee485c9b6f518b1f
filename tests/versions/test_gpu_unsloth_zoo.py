"""The CUDA path, on a real GPU: every unsloth-zoo release of the matrix, upstream vs hotfix.

Marker ``gpu``: skipped without CUDA (CI never has one).  Run by the GPU kit
(``bash scripts/gpu/run``, docs/gpu.md), which installs transformers 4.56.2 and
each release into private folders and names them in HOTFIX_GPU_TRANSFORMERS /
HOTFIX_GPU_SITE.  Each case is a fresh interpreter (tools/gpu/whisper_steps.py):
the release's real ``gradient_checkpointing.py`` with its real CUDA layer
(``patch_unsloth_smart_gradient_checkpointing()``: its own pinned buffers and
streams), a Whisper with 30 s inputs (encoder activations above the 2 MiB
offload threshold), full fine-tuning, 3 steps on unchanged weights, each
compared with a step without checkpointing:

* upstream (HOTFIX_DISABLE=1): the seed's crash on every release (closure tensors);
* with hotfix: every parameter gradient equal in every step (fp32: 1e-6 relative,
  hotfix.diagnostics.compare's rule; bf16: 2e-2, bf16's 8 significant bits through a dozen
  layers of recomputation with the same kernels), and unsloth's offload line
  printed during step 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CRASH, REPO, matrix_versions

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

STEPS = REPO / "tools" / "gpu" / "whisper_steps.py"


def _zoo_dir(version):
    site = os.environ.get("HOTFIX_GPU_SITE")
    folder = Path(site or "/nonexistent") / f"unsloth-zoo-{version}"
    if not folder.is_dir():
        pytest.skip(f"{folder} missing: run through scripts/gpu/run (HOTFIX_GPU_SITE)")
    return folder


def _run(version, dtype, disabled):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTFIX_") and k != "PYTHONPATH"}
    transformers_dir = os.environ.get("HOTFIX_GPU_TRANSFORMERS")
    if transformers_dir:
        env["PYTHONPATH"] = transformers_dir
    if disabled:
        env["HOTFIX_DISABLE"] = "1"
    cmd = [sys.executable, str(STEPS), "--mode", "unsloth", "--zoo", str(_zoo_dir(version)), "--dims", "test",
           "--dtype", dtype, "--batches", "2", "--steps", "3", "--compare"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)  # inside run's 280 s backstop
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows, proc.stderr[-3000:]
    return rows[0], proc


@pytest.mark.parametrize("version", matrix_versions("unsloth-zoo"))
def test_upstream_crashes_and_hotfix_trains_with_offload_from_step_1(version):
    upstream, _ = _run(version, "float32", disabled=True)
    assert upstream["status"] == "crash" and CRASH in upstream["error"], upstream
    fixed, proc = _run(version, "float32", disabled=False)
    assert fixed["status"] == "ok", (fixed, proc.stderr[-2000:])
    assert fixed["grads_equal"] == [True, True, True], fixed
    assert fixed["offload_message_step1"] is True, (fixed, proc.stderr[-2000:])


@pytest.mark.parametrize("version", [matrix_versions("unsloth-zoo")[0], matrix_versions("unsloth-zoo")[-1]])
def test_bf16_gradients_equal_with_hotfix(version):
    fixed, proc = _run(version, "bfloat16", disabled=False)
    assert fixed["status"] == "ok" and fixed["grads_equal"] == [True, True, True], (fixed, proc.stderr[-2000:])
