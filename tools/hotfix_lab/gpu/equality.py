"""The GPU kit's one rule for "every gradient equals a step without checkpointing" on CUDA.

Why a rule of its own: on CUDA two training steps *without* checkpointing already
differ.  Measured 2026-11-25 (H100, Whisper at the kit's test dims, fp32): 1.16e-5
relative with default settings, 2.2e-6 with deterministic algorithms (memory-efficient
attention stays non-deterministic), 0.0 with math attention only as well
(``../shared/gpu-runs/2026-11-25/``).  A fixed 1e-6 against default settings fails for
noise, not for hotfix; a loose fixed bound would hide a real error.  So:

* :func:`deterministic` sets what made two steps bit-identical there: deterministic
  algorithms, no TF32, math attention only, ``CUBLAS_WORKSPACE_CONFIG``.  Under it fp32
  compares at hotfix.diagnostics.compare's 1e-6.
* :func:`allowed_error` widens that only by what the same run measured: NOISE_FACTOR
  times the error between two steps without checkpointing (the noise floor) or between
  the reference and ``use_reentrant=False`` (the workaround's own deviation: in bf16 at
  whisper-large-v3's dims recomputation moved gradients ~1.6 % for the workaround too).
* :func:`judge` compares with that bound through hotfix's one comparison
  (``compare_grads``): a missing or unexpected gradient is never equal, whatever the bound.
"""

from __future__ import annotations

import os

#: how far above what the same run measured a checkpointed step may be.  The 2026-11-25
#: ratios were 0.93 (fp32, default settings: hotfix 1.08e-5 / floor 1.16e-5) and 0.92 - 1.01
#: (bf16, large-v3: hotfix / use_reentrant=False), so 3 leaves room for run-to-run spread
#: while a real error (a stale or foreign buffer: O(1)) stays far outside.
NOISE_FACTOR = 3.0


def deterministic(torch) -> None:
    """CUDA (and CPU) kernels that give bit-identical repeats: call before the first step."""
    # cuBLAS reads this when its handle is created, at the first matmul; setting it here is early enough.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: an op without a deterministic kernel warns instead of killing a rare GPU run; with the
    # settings below the 2026-11-25 repeats were bit-identical all the same.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_math_sdp(True)


def allowed_error(dtype: str, floor=None, workaround=None) -> float:
    """The largest relative gradient error that still counts as equal.

    dtype: "float32", "bfloat16", ...; floor: error between two steps without checkpointing in this
    run; workaround: error of ``use_reentrant=False`` against the reference in this run (None: not
    measured).  The larger of hotfix.diagnostics.compare's tolerance for the dtype (fp32 1e-6; bf16
    2e-2, about five bf16 rounding steps: reentrant recomputation sums a tensor's gradient
    contributions in another order, 3.3e-3 in bf16 on CPU where use_reentrant=False is exact) and
    NOISE_FACTOR times what was measured.
    """
    from hotfix.diagnostics.compare import tolerance_for

    measured = [value for value in (floor, workaround) if value is not None]
    return max([tolerance_for(dtype)] + [NOISE_FACTOR * value for value in measured])


def judge(reference, candidate, bound):
    """hotfix's GradReport of ``candidate`` against ``reference`` at ``bound``: ``.ok`` is the verdict
    (a missing gradient fails at any bound), ``.max_error`` the measured error."""
    from hotfix.diagnostics.compare import compare_grads

    return compare_grads(reference, candidate, rtol=bound)


def deviation(reference, candidate) -> float:
    """The largest relative error between two gradient sets (what a noise measurement records)."""
    from hotfix.diagnostics.compare import compare_grads

    return compare_grads(reference, candidate).max_error
