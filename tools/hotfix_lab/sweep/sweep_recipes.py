"""What people train, applied to a model the sweep built: the recipes.

``full``              every parameter trains (full fine-tuning)
``lora``              PEFT LoRA (r=4, random B so every adapter weight has a gradient) on the
                      attention projections, the base frozen, no ``enable_input_require_grads()``
``lora-input-grads``  the same after ``enable_input_require_grads()`` (the documented PEFT recipe)
``frozen-tower``      a model with a vision or audio tower: the tower frozen, the rest trains

A recipe that does not apply to a model (no attention projection PEFT can wrap,
no tower, no input embeddings to hook) raises :class:`NotApplicable` with the
reason; the sweep records it and the coverage counts only recipes that apply.
"""

from __future__ import annotations

from typing import List

RECIPES = ("full", "lora", "lora-input-grads", "frozen-tower")

#: last name component of the attention projections LoRA targets, across transformers' models
ATTENTION_PROJECTIONS = frozenset({
    "q_proj", "v_proj", "query", "value", "q", "v", "qkv", "qkv_proj", "c_attn", "Wqkv", "query_key_value",
    "q_lin", "v_lin", "to_q", "to_v", "in_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
    "query_proj", "value_proj", "Wq", "Wv", "wq", "wv", "qkv_linear",
})
#: attribute names of vision/audio towers, looked up on the model and on ``model.model``
TOWERS = ("vision_tower", "vision_model", "visual", "vision_encoder", "image_encoder", "vision",
          "audio_tower", "audio_model", "audio_encoder", "speech_encoder", "vision_backbone", "backbone")


class NotApplicable(Exception):
    """The recipe does not apply to this model (the message says why)."""


def lora_targets(model) -> List[str]:
    """Full names of the attention projections in ``model`` that PEFT can wrap.

    Full names, not PEFT's usual last components: a model may hold another module kind under the
    same name, which PEFT refuses (5.x Gemma-4 and DiffusionGemma towers' ``q_proj`` is a
    ``Gemma4ClippableLinear`` around a Linear: "Target module ... is not supported").
    """
    import torch

    kinds = [torch.nn.Linear]
    try:
        from transformers.pytorch_utils import Conv1D  # GPT-2 style projections; PEFT wraps them too

        kinds.append(Conv1D)
    except ImportError:
        pass
    return sorted(name for name, module in model.named_modules()
                  if isinstance(module, tuple(kinds)) and name.rsplit(".", 1)[-1] in ATTENTION_PROJECTIONS)


def tower_of(model):
    """(attribute name, module) of the model's vision/audio tower, or (None, None).

    An encoder-decoder whose input is audio or pixels (Whisper, Speech2Text, VisionEncoderDecoder):
    its encoder is the tower ("freeze the encoder" is the usual Whisper recipe).
    """
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False) and \
            getattr(model, "main_input_name", "") in ("input_features", "input_values", "pixel_values"):
        encoder = model.get_encoder() if hasattr(model, "get_encoder") else None
        if encoder is not None:
            return "encoder", encoder
    for owner in (model, getattr(model, "model", None)):
        if owner is None:
            continue
        for name in TOWERS:
            tower = getattr(owner, name, None)
            if tower is not None and hasattr(tower, "parameters") and any(True for _ in tower.parameters()):
                return name, tower
    return None, None


def apply(model, recipe: str):
    """``model`` prepared for ``recipe`` (PEFT returns a wrapper: use the returned model)."""
    if recipe == "full":
        return model
    if recipe in ("lora", "lora-input-grads"):
        targets = lora_targets(model)
        if not targets:
            raise NotApplicable("no attention projection PEFT LoRA can wrap")
        import torch.distributed.tensor  # noqa: F401  PEFT reads torch.distributed.tensor.DTensor without
        # importing it; newer transformers lines import it first, 4.46 does not (AttributeError)
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, init_lora_weights=False)
        try:
            peft_model = get_peft_model(model, config).train()
        except NotImplementedError as exc:
            if "get_input_embeddings" not in str(exc):
                raise
            # PEFT's tied-weights check asks every model for its input embeddings; a model that has none
            # (PE Audio-Video, Granite Speech 5 CTC) cannot be wrapped at all, with or without checkpointing
            raise NotApplicable("PEFT cannot wrap it: get_peft_model's tied-weights check calls "
                                f"get_input_embeddings(), which {type(model).__name__} does not implement") from None
        if recipe == "lora-input-grads":
            try:
                peft_model.enable_input_require_grads()
            except (NotImplementedError, AttributeError) as exc:
                raise NotApplicable(f"enable_input_require_grads() not available: {type(exc).__name__}") from None
        return peft_model
    if recipe == "frozen-tower":
        name, tower = tower_of(model)
        if tower is None:
            raise NotApplicable("no vision/audio tower")
        tower.requires_grad_(False)
        if not any(p.requires_grad for p in model.parameters()):
            raise NotApplicable(f"nothing trains once {name} is frozen")
        return model
    raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
