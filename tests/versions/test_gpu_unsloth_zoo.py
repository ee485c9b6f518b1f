"""The CUDA path, on a real GPU: every unsloth-zoo release of the matrix, upstream vs hotfix.

Marker ``gpu``: skipped without CUDA, unless HOTFIX_GPU_DEVICE=cpu (the kit's CPU
self-test, ``scripts/gpu/run --cpu-selftest --part tests``, in CI: the same checks on a
tiny Whisper through tools/hotfix_lab/infra/zoo_loader.py's CPU seam, without the offload line).
Run by the GPU kit (``bash scripts/gpu/run --part tests``, docs/gpu.md), which installs
transformers 4.56.2 and each release into private folders and names them in
HOTFIX_GPU_TRANSFORMERS / HOTFIX_GPU_SITE.  Each case is a fresh interpreter
(tools/hotfix_lab/gpu/whisper_steps.py), several at a time (HOTFIX_GPU_JOBS): the release's real
``gradient_checkpointing.py`` with its real CUDA layer
(``patch_unsloth_smart_gradient_checkpointing()``: its own pinned buffers and streams),
a Whisper with 30 s inputs at batch BATCH (4), full fine-tuning, 3 steps on unchanged
weights, each compared with a step without checkpointing, with tools/hotfix_lab/gpu/equality.py's
deterministic kernels (two steps without checkpointing bit-identical on the H100, 2026-11-25).
Batch 4 because every release must offload: an encoder layer's input at the test dims is
1500 x 256 values a sample, and the 2 MiB cutoff is counted in elements of the set-up dtype
before 2026.9.8, in the input's bytes by hotfix's own offloader (which runs below 2026.8.11),
both: fp32 batch 2 offloads, bf16 batch 2 does not; and in stored bytes from 2026.9.8 on,
where an fp32 input is stored, and counted, as bf16 unless UNSLOTH_OFFLOAD_FP32=exact
(2026.10.9, batch 2: 1.5 MiB, no offload line on the H100, 2026-11-25).  Batch 4 is over the
cutoff in every release and dtype.  The fp32 cases pass ``--offload-fp32 exact`` (read by
2026.9.8 and later, of the matrix 2026.10.9; the others have no such setting and store fp32 as
fp32), so the offloaded input the recomputation starts from is the exact one:

* upstream (HOTFIX_DISABLE=1): the seed's crash on every release (closure tensors);
* with hotfix, fp32: every parameter gradient equal in every step at 1e-6 relative, or
  within 3x this run's noise floor (two steps without checkpointing) if that is larger,
  and (CUDA) unsloth's offload line printed during step 1;
* with hotfix, bf16: within the larger of 2e-2 and 3x what use_reentrant=False deviates
  in the same run.

A missing gradient is never equal.  HOTFIX_GPU_MUTATION=drop-grad drops one gradient in
every hotfix run: the equality tests must then fail (tests/lab/test_gpu_kit.py checks so).
HOTFIX_GPU_OUT: a folder where every case's result row is kept (gpu-test-cases.jsonl).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import CRASH, TOOLS, matrix_versions

torch = pytest.importorskip("torch")
DEVICE = os.environ.get("HOTFIX_GPU_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE is None, reason="needs CUDA (HOTFIX_GPU_DEVICE=cpu: the kit's CPU self-test)")]

STEPS = ["-P", "-m", "hotfix_lab.gpu.whisper_steps"]
DIMS = "test" if DEVICE == "cuda" else "tiny-cpu"
RELEASES = [v for v in os.environ.get("HOTFIX_GPU_RELEASES", "").split(",") if v] or matrix_versions("unsloth-zoo")
MUTATION = os.environ.get("HOTFIX_GPU_MUTATION")
JOBS = int(os.environ.get("HOTFIX_GPU_JOBS") or min(8, os.cpu_count() or 1))
#: over unsloth's 2 MiB offload cutoff in every release and dtype at the test dims (the module docstring)
BATCH = 4


def _zoo_dir(version):
    site = os.environ.get("HOTFIX_GPU_SITE")
    folder = Path(site or "/nonexistent") / f"unsloth-zoo-{version}"
    if not folder.is_dir():
        pytest.skip(f"{folder} missing: run through scripts/gpu/run (HOTFIX_GPU_SITE)")
    return folder


def _run(version, dtype, disabled):
    """(result row, process) of one case: whisper_steps in a fresh interpreter, run from outside the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTFIX_") and k != "PYTHONPATH"}
    transformers_dir = os.environ.get("HOTFIX_GPU_TRANSFORMERS")
    env["PYTHONPATH"] = os.pathsep.join([transformers_dir, str(TOOLS)] if transformers_dir else [str(TOOLS)])
    if disabled:
        env["HOTFIX_DISABLE"] = "1"
    cmd = [sys.executable, *STEPS, "--mode", "unsloth", "--zoo", str(_zoo_dir(version)), "--dims", DIMS,
           "--device", DEVICE, "--dtype", dtype, "--batches", str(BATCH), "--steps", "3", "--compare", "--deterministic"]
    # fp32 is asserted exact: the releases that store offloaded fp32 inputs as bf16 by default are told not to
    cmd += ["--noise-floor", "--offload-fp32", "exact"] if dtype == "float32" else ["--against", "non-reentrant"]
    if MUTATION and not disabled:
        cmd += ["--mutate", MUTATION]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120 if DEVICE == "cuda" else 400,
                          cwd=str(TOOLS))
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return (rows[0] if rows else None), proc


#: test -> the case (dtype, hotfix off?) it reads, per release
CASES = {"test_upstream_crashes": ("float32", True), "test_hotfix_gradients_equal_and_offload_from_step_1":
         ("float32", False), "test_bf16_gradients_equal_with_hotfix": ("bfloat16", False)}


@pytest.fixture(scope="module")
def runs(request):
    """Every case the selected tests read, started together (JOBS at a time): {(version, dtype, off): future}."""
    wanted = sorted({(item.callspec.params["version"], *CASES[item.originalname]) for item in request.session.items
                     if item.module is request.module and item.originalname in CASES and hasattr(item, "callspec")})
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        futures = {case: pool.submit(_run, *case) for case in wanted}
        yield futures
    out = os.environ.get("HOTFIX_GPU_OUT")  # the kit keeps every case's row (bound, noise, errors) as evidence
    if out:
        with open(os.path.join(out, "gpu-test-cases.jsonl"), "a") as handle:
            for (version, dtype, disabled), future in futures.items():
                row = future.result()[0] if future.done() and not future.exception() else None
                handle.write(json.dumps({"release": version, "dtype": dtype, "hotfix": not disabled, "row": row}) + "\n")


def _result(runs, version, dtype, disabled):
    _zoo_dir(version)
    row, proc = runs[(version, dtype, disabled)].result()
    assert row, f"rc {proc.returncode}\n{proc.stderr[-3000:]}"
    return row, proc


@pytest.mark.parametrize("version", RELEASES)
def test_upstream_crashes(version, runs):
    upstream, proc = _result(runs, version, "float32", True)
    assert upstream["status"] == "crash" and CRASH in upstream["error"], upstream


@pytest.mark.parametrize("version", RELEASES)
def test_hotfix_gradients_equal_and_offload_from_step_1(version, runs):
    fixed, proc = _result(runs, version, "float32", False)
    assert fixed["status"] == "ok", (fixed, proc.stderr[-2000:])
    assert fixed["hotfix"] and fixed["deterministic"], fixed
    assert fixed["grads_equal"] == [True, True, True], fixed  # bound: fixed["bound"], noise: fixed["noise_floor"]
    assert fixed["offload_fp32"] in (None, "exact"), fixed  # None: the release stores fp32 as fp32
    if DEVICE == "cuda":
        assert fixed["offload_message_step1"] is True, (fixed, proc.stderr[-2000:])


@pytest.mark.parametrize("version", sorted({RELEASES[0], RELEASES[-1]}))
def test_bf16_gradients_equal_with_hotfix(version, runs):
    fixed, proc = _result(runs, version, "bfloat16", False)
    assert fixed["status"] == "ok" and fixed["grads_equal"] == [True, True, True], (fixed, proc.stderr[-2000:])
