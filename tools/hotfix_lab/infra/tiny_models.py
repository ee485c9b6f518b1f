"""Tiny random-weight models that hit the checkpointing bugs, built on CPU in milliseconds.

Each builder returns ``(model, batch)``; the model is in training mode and
seeded, the batch is fixed.  The tests (in fresh interpreters of every
transformers release in the matrix), the benchmarks and the GPU kit build theirs
here; ``hotfix doctor``'s two Whisper builders come from the product
(hotfix/diagnostics/doctor_models.py, loaded by path).

This module imports torch, transformers and (for LoRA) peft, never hotfix:
children that must start unpatched import it before transformers.
"""

from __future__ import annotations

import torch
from torch import nn

from hotfix_lab.infra import standalone


# The doctor's Whisper is the one the tests use too (one definition).
_doctor = standalone.load("doctor_models")
_gen, whisper, whisper_frozen = _doctor._gen, _doctor.whisper, _doctor.whisper_frozen


def deberta_v2(seed=0):
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    cfg = DebertaV2Config(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=32, relative_attention=True,
                          position_buckets=8, norm_rel_ebd="layer_norm", pos_att_type=["p2c", "c2p"],
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)
    torch.manual_seed(seed)
    model = DebertaV2ForSequenceClassification(cfg).train()
    g = _gen(seed + 1)
    return model, {"input_ids": torch.randint(3, 100, (2, 7), generator=g),
                   "labels": torch.randint(0, 3, (2,), generator=g)}


def layoutlm(seed=0):
    from transformers import LayoutLMConfig, LayoutLMForSequenceClassification

    cfg = LayoutLMConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32, max_2d_position_embeddings=64,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)
    torch.manual_seed(seed)
    model = LayoutLMForSequenceClassification(cfg).train()
    g = _gen(seed + 1)
    x0 = torch.randint(0, 30, (2, 7, 1), generator=g)
    y0 = torch.randint(0, 30, (2, 7, 1), generator=g)
    bbox = torch.cat([x0, y0, x0 + 5, y0 + 5], dim=-1)
    return model, {"input_ids": torch.randint(3, 100, (2, 7), generator=g), "bbox": bbox,
                   "labels": torch.randint(0, 3, (2,), generator=g)}


def wavlm(seed=0):
    from transformers import WavLMConfig, WavLMForSequenceClassification

    cfg = WavLMConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                      conv_dim=(8, 8), conv_stride=(4, 4), conv_kernel=(8, 8), num_conv_pos_embeddings=8,
                      num_conv_pos_embedding_groups=2, num_buckets=16, max_bucket_distance=32,
                      hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                      feat_proj_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, num_labels=3,
                      classifier_proj_size=8)
    torch.manual_seed(seed)
    model = WavLMForSequenceClassification(cfg).train()
    g = _gen(seed + 1)
    return model, {"input_values": torch.randn(2, 400, generator=g),
                   "labels": torch.randint(0, 3, (2,), generator=g)}


def custom_layer(seed=0, nested=False, positional=False):
    """A third-party GradientCheckpointingLayer that takes a grad tensor by keyword.

    ``positional``: the grad tensors come positionally but inside a container
    (5.x MLCD's ``position_embeddings`` list), which reentrant checkpointing
    does not treat as inputs either.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    class MixLayer(GradientCheckpointingLayer):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.mix = nn.Linear(8, 8)

        def forward(self, hidden, context=None, pair=None):
            if pair is not None:
                context = pair[0] + pair[1]["ctx"]
            return torch.tanh(self.proj(hidden) + self.mix(context))

    class Tiny(nn.Module):
        supports_gradient_checkpointing = True

        def __init__(self):
            super().__init__()
            self.context = nn.Linear(8, 8)
            self.embed = nn.Linear(8, 8)
            self.layers = nn.ModuleList([MixLayer() for _ in range(3)])
            self.gradient_checkpointing = False

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            """transformers' API, on a model that is not a PreTrainedModel (use_reentrant defaults to True)."""
            from functools import partial
            from torch.utils.checkpoint import checkpoint

            use_reentrant = (gradient_checkpointing_kwargs or {}).get("use_reentrant", True)
            for module in self.modules():
                if isinstance(module, GradientCheckpointingLayer):
                    module.gradient_checkpointing = True
                    module._gradient_checkpointing_func = partial(checkpoint, use_reentrant=use_reentrant)

        def forward(self, x, labels):
            ctx = self.context(x)
            h = self.embed(x)
            for layer in self.layers:
                if positional:
                    h = layer(h, None, [ctx * 0.5, {"ctx": ctx * 0.5}])
                elif nested:
                    h = layer(h, pair=(ctx * 0.5, {"ctx": ctx * 0.5}))
                else:
                    h = layer(h, context=ctx)
            loss = (h - labels).pow(2).mean()
            return type("Out", (), {"loss": loss})()

    torch.manual_seed(seed)
    model = Tiny().train()
    g = _gen(seed + 1)
    return model, {"x": torch.randn(4, 8, generator=g), "labels": torch.randn(4, 8, generator=g)}


def custom_layer_nested(seed=0):
    return custom_layer(seed, nested=True)


def custom_layer_positional(seed=0):
    return custom_layer(seed, positional=True)


def pvt_v2(seed=0):
    """Each encoder stage is one checkpointed layer returning ((hidden,), height, width): nested outputs."""
    from transformers import PvtV2Config, PvtV2ForImageClassification

    cfg = PvtV2Config(image_size=32, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                      patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                      num_labels=3)
    torch.manual_seed(seed)
    model = PvtV2ForImageClassification(cfg).train()
    g = _gen(seed + 1)
    return model, {"pixel_values": torch.randn(2, 3, 32, 32, generator=g),
                   "labels": torch.randint(0, 3, (2,), generator=g)}


BUILDERS = {
    "pvt-v2": pvt_v2,
    "whisper": whisper,
    "whisper-frozen-decoder-embeddings": whisper_frozen,
    "deberta-v2": deberta_v2,
    "layoutlm": layoutlm,
    "wavlm": wavlm,
    "custom-layer": custom_layer,
    "custom-layer-nested": custom_layer_nested,
    "custom-layer-positional": custom_layer_positional,
}


# -- frozen-input cases (patches/transformers_frozen_inputs.py) ---------------
# Whisper fine-tuned with adapters on q_proj/v_proj, everything else frozen,
# after enable_input_require_grads(): on 4.x no input of an encoder layer
# requires grad (the conv front-end is frozen and only the decoder embeddings
# get the hook), so reentrant checkpointing drops the encoder adapters' grads.

def _whisper_adapter_ready(model):
    model.enable_input_require_grads()
    return model


def whisper_lora(seed=0, input_require_grads=True):
    """PEFT LoRA on q_proj/v_proj (random B, so every LoRA weight has a non-zero gradient)."""
    from peft import LoraConfig, get_peft_model  # ImportError -> the case is n/a

    model, batch = whisper(seed)
    torch.manual_seed(seed + 2)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)
    model = get_peft_model(model, config).train()
    return (_whisper_adapter_ready(model) if input_require_grads else model), batch


def whisper_lora_no_hook(seed=0):
    """PEFT LoRA on q_proj/v_proj without enable_input_require_grads() (issue 11's script)."""
    return whisper_lora(seed, input_require_grads=False)


def whisper_qv_only(seed=0):
    """LoRA emulated without peft: only the q_proj/v_proj weights and biases train."""
    model, batch = whisper(seed)
    for name, param in model.named_parameters():
        param.requires_grad_(".q_proj." in name or ".v_proj." in name)
    return _whisper_adapter_ready(model), batch


def whisper_qv_only_no_hook(seed=0):
    """The same, without enable_input_require_grads(): no input of any layer needs grad."""
    model, batch = whisper(seed)
    for name, param in model.named_parameters():
        param.requires_grad_(".q_proj." in name or ".v_proj." in name)
    return model, batch


BUILDERS.update({
    "whisper-lora": whisper_lora,
    "whisper-qv-only": whisper_qv_only,
    "whisper-qv-no-hook": whisper_qv_only_no_hook,
    "whisper-lora-no-hook": whisper_lora_no_hook,
})


def whisper_trainer(samples=12, **training_args):
    """A Seq2SeqTrainer over the tiny Whisper with gradient checkpointing on (CPU), ``training_args`` added."""
    import tempfile

    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    model, _ = whisper()
    g = _gen(0)
    data = [{"input_features": torch.randn(8, 20, generator=g),
             "labels": torch.randint(3, 100, (5,), generator=g)} for _ in range(samples)]
    args = Seq2SeqTrainingArguments(**dict(dict(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=2, max_steps=3, gradient_checkpointing=True,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none", remove_unused_columns=False,
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True), **training_args))

    def collate(features):
        return {key: torch.stack([f[key] for f in features]) for key in features[0]}

    return Seq2SeqTrainer(model=model, args=args, train_dataset=data, data_collator=collate)
