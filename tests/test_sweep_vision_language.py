"""Vision-tower LoRA on transformers 5.23.0 (unsloth issue 5039's symptom), through the sweep's own code path.

Qwen3-VL and GLM-4V, built by tools/sweep_families (patch grid + grid_thw, image placeholder
tokens), PEFT LoRA on the attention projections, base frozen, AFTER enable_input_require_grads()
(the documented PEFT recipe).  Reentrant checkpointing — what unsloth-zoo forces on 5.x, through
its own UnslothCheckpointFunction, and torch's — leaves the vision tower's adapters without a
gradient: the hook marks the text embeddings' output, but the vision tower's first input (the
pixel patches) does not need grad, so its checkpointed blocks have no input that does.  Measured
2026-11-23 (torch 2.13.0 CPU): 4 of 12 adapter gradients missing upstream with either function;
with hotfix (transformers-frozen-inputs, gated on the mechanism) every gradient equals a run
without checkpointing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, matrix_path


def test_vision_tower_adapters_lose_gradients_upstream_and_hotfix_restores_them(tmp_path):
    matrix_path("transformers", "5.23.0")
    matrix_path("unsloth-zoo", "2026.10.9")
    results = tmp_path / "vlm.jsonl"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "sweep_models.py"), "--versions", "5.23.0", "--models", "qwen3_vl,glm4v",
         "--recipes", "lora-input-grads", "--functions", "torch,unsloth", "--fresh", "--jobs", "2",
         "--results", str(results), "--doc", str(tmp_path / "vlm.md")],
        capture_output=True, text=True, timeout=900, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = {}
    for line in results.read_text().splitlines():
        row = json.loads(line)
        if not row["model_type"].startswith("__"):
            got[(row["model_type"], row["function"], row["hotfix"])] = row
    assert len(got) == 8, sorted(got)
    for model_type in ("qwen3_vl", "glm4v"):
        for function in ("torch", "unsloth"):
            upstream, fixed = got[(model_type, function, False)], got[(model_type, function, True)]
            reentrant = upstream["modes"]["reentrant"]
            assert upstream["result"] == "FAIL" and reentrant["missing"] == 4 and reentrant["total"] == 12, upstream
            assert fixed["result"] == "pass", fixed
            assert fixed["modes"]["reentrant"]["status"] == "equal", fixed
            if function == "unsloth":
                assert "UnslothCheckpointFunction" in fixed["checkpoint_function"], fixed
            else:
                assert upstream["modes"]["non-reentrant"]["status"] == "equal", upstream  # reentrant only


def test_gemma4_kv_sharing_gradients_wrong_upstream_and_exact_with_hotfix(tmp_path):
    """Found by the sweep's `gemma4+kv_shared` variant (5.23.0): with num_kv_shared_layers > 0 (as in
    the E2B/E4B checkpoints) the last layers reuse the keys/values an earlier layer stored into
    `shared_kv_states` (a KVSharingDict handed to every layer).  Under reentrant checkpointing the
    storing layer's forward runs without grad, so the later layers read constants: upstream 24 of 63
    gradients WRONG in full fine-tuning (up to 46 % relative), 6 of 12 LoRA adapters, through torch's
    and unsloth's function alike, no error; non-reentrant checkpointing is exact.  With hotfix
    (transformers-keyword-tensors, patches/_checkpoint_shared_state.py) the stored tensors become
    checkpoint outputs and every gradient equals the run without checkpointing."""
    matrix_path("transformers", "5.23.0")
    results = tmp_path / "kv.jsonl"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "sweep_models.py"), "--versions", "5.23.0", "--models",
         "gemma4+kv_shared", "--recipes", "full,lora", "--functions", "torch,unsloth", "--fresh",
         "--jobs", "2", "--results", str(results), "--doc", str(tmp_path / "kv.md")],
        capture_output=True, text=True, timeout=900, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    rows = [r for r in rows if r["model_type"] == "gemma4+kv_shared"]
    cells = {(r["function"], r["recipe"], r["hotfix"]): r for r in rows}
    assert len(cells) == 8, sorted(cells)
    for (function, recipe, hotfix), row in cells.items():
        reentrant = row["modes"]["reentrant"]
        if hotfix:
            assert row["result"] == "pass" and reentrant["status"] == "equal", row
        else:
            assert reentrant["status"] == "wrong", row  # silently wrong upstream, not missing, no error
        if function == "torch":
            assert row["modes"]["non-reentrant"]["status"] == "equal", row
