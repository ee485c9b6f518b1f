"""Vision-tower LoRA on transformers 5.23.0 (unsloth issue 5039's symptom), through the sweep's own code path.

Qwen3-VL and GLM-4V, built by tools/hotfix_lab/sweep/sweep_families (patch grid + grid_thw, image placeholder
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

from conftest import run_sweep


def test_vision_tower_adapters_lose_gradients_upstream_and_hotfix_restores_them(tmp_path):
    rows = run_sweep(tmp_path, "5.23.0", "qwen3_vl,glm4v", "lora-input-grads")
    got = {(row["model_type"], row["function"], row["hotfix"]): row for row in rows}
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
