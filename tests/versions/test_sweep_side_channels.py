"""Tensors that reach a checkpointed layer by a side channel, on transformers 5.23.0, through the sweep's own path.

Found by the sweep; each test runs the model type upstream (``HOTFIX_DISABLE=1``) and with hotfix, through
torch's checkpoint function and unsloth-zoo's ``UnslothCheckpointFunction``, against a run without
checkpointing (transformers-checkpoint-layer-io; in-process reproductions in tests/unit/).
"""

from __future__ import annotations

from conftest import assert_sweep_cells, run_sweep


def test_gemma4_kv_sharing_gradients_wrong_upstream_and_exact_with_hotfix(tmp_path):
    """The `gemma4+kv_shared` variant: with num_kv_shared_layers > 0 (as in the E2B/E4B checkpoints) the
    last layers reuse the keys/values an earlier layer stored into `shared_kv_states` (a KVSharingDict
    handed to every layer).  Under reentrant checkpointing the storing layer's forward runs without grad,
    so the later layers read constants: upstream 24 of 63 gradients WRONG in full fine-tuning (up to 46 %
    relative), 6 of 12 LoRA adapters, through torch's and unsloth's function alike, no error;
    non-reentrant checkpointing is exact.  With hotfix (hotfix/checkpointing/shared_state.py) the stored
    tensors become checkpoint outputs and every gradient equals the run without checkpointing."""
    rows = run_sweep(tmp_path, "5.23.0", "gemma4+kv_shared", "full,lora")
    # silently wrong upstream, not missing, no error
    assert_sweep_cells(rows, 8, upstream=lambda reentrant: reentrant["status"] == "wrong")


def test_diffusion_gemma_cache_crashes_upstream_and_is_exact_with_hotfix(tmp_path):
    """DiffusionGemma's decoder layers read the encoder's keys/values from `past_key_values` (a
    DynamicCache handed to every layer by keyword).  Under reentrant checkpointing each decoder layer's
    recomputation reaches the encoder's graph through the cache: upstream "Trying to backward through the
    graph a second time", through torch's and unsloth's function; non-reentrant is exact.  With hotfix
    (hotfix/checkpointing/inputs.py searches caches) the cached tensors become checkpoint inputs: every
    gradient (76) equals the run without checkpointing.  Full fine-tuning only here; the sweep runs LoRA."""
    rows = run_sweep(tmp_path, "5.23.0", "diffusion_gemma", "full")
    assert_sweep_cells(rows, 4, upstream=lambda reentrant: reentrant["status"] == "crash"
                       and "second time" in reentrant["summary"])
