"""One step of a "repaired" walk case in this interpreter: one JSON line per ``CASE:MODE``.

    python repair_walk.py CASE:MODE [CASE:MODE ...]

MODE is ``reentrant`` / ``non-reentrant`` (``gradient_checkpointing_enable`` with that
``use_reentrant``) or ``none`` (no checkpointing at all: the reference step alone).  hotfix's
engine (``hotfix.diagnostics.checker.check_model``) runs one step without checkpointing and one in
the mode, every trainable gradient compared at 1e-6 relative; ``status`` is ``equal``, ``wrong``
(a gradient missing or different) or ``crash`` (also a crash of the step without checkpointing:
an ``enable_input_require_grads()`` hook crashes every forward).  tests/e2e/test_repair_truth.py
runs each case with hotfix on and with ``HOTFIX_DISABLE=1`` and reads the "repaired" lines.

The cases are tiny random-weight models built on CPU in milliseconds; Whisper comes from
tools/hotfix_lab/infra/tiny_models.py (the e2e cases' builders), GIT and Llava are built here.
"""

from __future__ import annotations

import json
import sys

import torch

from hotfix_lab.infra import tiny_models  # tools/hotfix_lab (on the child's PYTHONPATH)


def _only_query_value_train(model):
    """LoRA's situation without peft: everything frozen but the attention's query/value weights."""
    for name, param in model.named_parameters():
        param.requires_grad_(any(part in name for part in (".query.", ".value.", ".q_proj.", ".v_proj.")))
    return model


def git_qv(seed=0):
    """Tiny GIT (``embeddings += position_embeddings`` right after the word embeddings), q/v training, after
    ``enable_input_require_grads()`` (the PEFT recipe): the hook's leaf is changed in place."""
    import transformers

    torch.manual_seed(seed)
    vision = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                  image_size=16, patch_size=8)
    config = transformers.GitConfig(vision_config=vision, vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, use_cache=False)
    model = _only_query_value_train(transformers.GitModel(config).train())
    model.enable_input_require_grads()
    return model, {"input_ids": torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(seed))}


def llava_lora(seed=0):
    """Tiny Llava (CLIP vision tower, Llama text model), PEFT LoRA on every q_proj/v_proj of both towers, after
    ``enable_input_require_grads()``: the hook reaches the text embeddings only, so the vision tower's
    checkpointed layers have no input needing grad (issue 31's case; the text embeddings are not changed
    in place)."""
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=16, patch_size=8, projection_dim=16)
    text = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=63,
                                      vision_feature_layer=-1, vision_feature_select_strategy="default")
    model = transformers.LlavaForConditionalGeneration(config).train()
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                                             target_modules=["q_proj", "v_proj"])).train()
    model.enable_input_require_grads()
    g = torch.Generator().manual_seed(seed + 1)
    text_ids = torch.randint(3, 60, (2, 6), generator=g)
    image_ids = torch.full((2, 4), 63)  # 16x16 image, 8x8 patches, CLS dropped: 4 features per image
    input_ids = torch.cat([text_ids[:, :1], image_ids, text_ids[:, 1:]], dim=1)
    return model, {"input_ids": input_ids, "pixel_values": torch.randn(2, 3, 16, 16, generator=g),
                   "labels": input_ids.clone()}


BUILDERS = {
    "whisper": tiny_models.whisper,
    "whisper-lora": tiny_models.whisper_lora,
    "git-qv": git_qv,
    "llava-lora": llava_lora,
}


def run(case: str, mode: str) -> dict:
    import transformers

    from hotfix.diagnostics.checker import check_model

    result = {"case": case, "mode": mode, "transformers": transformers.__version__}
    model, batch = BUILDERS[case]()
    report = check_model(model, batch, modes=[] if mode == "none" else [mode], rtol=1e-6, cut="raise",
                         time_limit=120.0, grace=20.0)
    if report.reference.status != "reference":
        return dict(result, status="crash", error=report.reference.error)
    if mode == "none":
        return dict(result, status="equal")
    step = report.modes[0]
    if step.grads is None:
        return dict(result, status="crash", error=step.error)
    return dict(result, status=step.status, missing=len(step.missing), wrong=len(step.wrong), total=step.total)


def main(argv) -> int:
    for item in argv:
        case, mode = item.split(":")
        print(json.dumps(run(case, mode)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
