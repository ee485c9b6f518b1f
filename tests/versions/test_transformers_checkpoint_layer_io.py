"""patches/transformers_checkpoint_layer_io.py across the transformers release matrix.

Every case runs twice in fresh interpreters of the same release: with
HOTFIX_DISABLE=1 (upstream behaviour: the failure must reproduce, or the test
proves nothing) and with hotfix active through the installed .pth.  "equal"
means every parameter gradient of the reentrant-checkpointed step matches a
step without checkpointing within 1e-6 relative (hotfix.diagnostics.compare).
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from conftest import LAB, json_lines, matrix_path, matrix_versions, run_python

CASES = [
    "whisper",
    "whisper-frozen-decoder-embeddings",
    "deberta-v2",
    "layoutlm",
    "custom-layer",
    "custom-layer-nested",
    "custom-layer-positional",  # grad tensors in a positional list (5.x MLCD)
    "pvt-v2",  # nested outputs: each stage returns ((hidden,), height, width)
    "wavlm",  # last: unpatched it trips the memory guard, which ends the child
]

# What upstream does with explicit use_reentrant=True, measured on CPU (torch
# 2.13.0) for each release of tests/matrix.txt: the cases that do NOT give
# no-checkpointing gradients there.  4.52.4 has GradientCheckpointingLayer
# already but no built-in model on it, so only a third-party layer hits the
# keyword bug there.  LayoutLM moved onto the layer class after 4.53; 5.x passes
# Whisper's and LayoutLM's tensors positionally.
_ALL = set(CASES)
_CUSTOM = {"custom-layer", "custom-layer-nested", "custom-layer-positional"}
# pvt-v2 loses 52 of 54 gradients on every release: reentrant checkpointing connects only top-level
# outputs.  On 4.52 its stages are not GradientCheckpointingLayers yet: the encoder calls its checkpoint
# function itself, and hotfix's slot on the encoder's class repairs it there.
UNPATCHED_BROKEN = {
    "4.52.4": _CUSTOM | {"pvt-v2"},
    "4.53.3": _ALL - {"layoutlm"},
    "4.56.2": _ALL,
    "4.57.6": _ALL,
    "5.0.0": _CUSTOM | {"deberta-v2", "wavlm", "pvt-v2"},
    "5.23.0": _CUSTOM | {"deberta-v2", "wavlm", "pvt-v2"},
}


def _line(version: str) -> str:
    v = Version(version)
    if v < Version("4.53.0"):
        return "4.52"
    return "4.5x" if v.major == 4 else "5.x"


def _run_cases(version, disabled, cases=CASES, default_checkpointing=False):
    args = [str(LAB / "grad_case.py")] + (["--default-checkpointing"] if default_checkpointing else []) + list(cases)
    # WavLM upstream grows without bound (each layer's recomputation re-walks position_bias's history); a
    # tiny model's step grows by a few MiB, so 256 MiB stops the runaway in ~15 s instead of ~90 s.
    env = {"GRAD_CASE_RSS_LIMIT": str(256 * 2**20)}
    if disabled:
        env["HOTFIX_DISABLE"] = "1"
    proc = run_python(args, env=env, pythonpath=[matrix_path("transformers", version)], timeout=900)
    results = {r["case"]: r for r in json_lines(proc.stdout)}
    assert results, proc.stderr[-3000:]
    return results


def _outcome(result):
    return "equal" if result and result["status"] == "equal" else "broken"


@pytest.mark.parametrize("version", matrix_versions("transformers"))
def test_reentrant_checkpointing_gradients(version):
    """Fails upstream as measured; with hotfix every case's gradients equal no-checkpointing."""
    unpatched = _run_cases(version, disabled=True)
    broken = {case for case in CASES if _outcome(unpatched.get(case)) == "broken"}
    assert broken == UNPATCHED_BROKEN[version], {c: unpatched.get(c) for c in CASES}

    patched = _run_cases(version, disabled=False)
    for case in CASES:
        result = patched.get(case)
        assert result and result["status"] == "equal", result
        assert result["missing"] == 0 and result["wrong"] == 0 and result["max_error"] <= 1e-6


@pytest.mark.parametrize("version", [v for v in matrix_versions("transformers") if _line(v) == "4.5x"])
def test_whisper_reproduction_error_text(version):
    """The seed report's exact symptom: the error users search for, then fixed."""
    unpatched = _run_cases(version, disabled=True, cases=["whisper"], default_checkpointing=True)
    assert unpatched["whisper"]["status"] == "crash"
    assert "Trying to backward through the graph a second time" in unpatched["whisper"]["error"]
    patched = _run_cases(version, disabled=False, cases=["whisper"], default_checkpointing=True)
    assert patched["whisper"]["status"] == "equal", patched["whisper"]


@pytest.mark.parametrize("version", [v for v in matrix_versions("transformers") if _line(v) == "5.x"])
def test_whisper_on_5x_trains_exactly_as_upstream(version):
    """5.x defaults to non-reentrant checkpointing: same loss and gradients with or without hotfix."""
    unpatched = _run_cases(version, disabled=True, cases=["whisper"], default_checkpointing=True)["whisper"]
    patched = _run_cases(version, disabled=False, cases=["whisper"], default_checkpointing=True)["whisper"]
    assert unpatched["status"] == patched["status"] == "equal"
    assert unpatched["loss"] == patched["loss"]
