"""Models, steps and measurements shared by tools/hotfix_lab/bench/run.py and its child processes.

Also runnable as a child:

    python -P -m hotfix_lab.bench.workloads rss VARIANT
        one Whisper training step at whisper-tiny dimensions in a fresh process,
        printing the peak-RSS increase of that step as one JSON line
"""

from __future__ import annotations

import functools
import json
import sys
import time

import torch

# Whisper-tiny dimensions (openai/whisper-tiny config), random weights: no download.
WHISPER_TINY = dict(
    vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
    encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536,
    max_source_positions=1500, max_target_positions=448, pad_token_id=50257, bos_token_id=50257,
    eos_token_id=50257, decoder_start_token_id=50258,
)
WHISPER_BATCH = 2          # 30 s of audio each (3000 mel frames)
WHISPER_LABELS = 32        # target tokens per sample

# Bart with the same width/depth: its layers get no grad-requiring keyword
# (encoder_hidden_states is positional there), so hotfix's wrapper only passes through.
BART = dict(
    vocab_size=8000, d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
    decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_position_embeddings=256,
    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
)
BART_BATCH, BART_SEQ = 2, 64

# variant -> gradient_checkpointing_kwargs (None: checkpointing off)
CHECKPOINTING = {
    "reentrant": {"use_reentrant": True},
    "non-reentrant": {"use_reentrant": False},
    "none": None,
}


def whisper_tiny(seed=0):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(WhisperConfig(**WHISPER_TINY)).train()
    g = torch.Generator().manual_seed(seed + 1)
    batch = {
        "input_features": torch.randn(WHISPER_BATCH, 80, 3000, generator=g),
        "labels": torch.randint(0, 50000, (WHISPER_BATCH, WHISPER_LABELS), generator=g),
    }
    return model, batch


def bart(seed=0):
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    model = BartForConditionalGeneration(BartConfig(**BART)).train()
    g = torch.Generator().manual_seed(seed + 1)
    batch = {
        "input_ids": torch.randint(4, 8000, (BART_BATCH, BART_SEQ), generator=g),
        "labels": torch.randint(4, 8000, (BART_BATCH, BART_SEQ), generator=g),
    }
    return model, batch


def set_checkpointing(model, variant):
    kwargs = CHECKPOINTING[variant]
    if kwargs is None:
        model.gradient_checkpointing_disable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def step(model, batch):
    """One training step (forward, backward); returns seconds."""
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    model(**batch).loss.backward()
    return time.perf_counter() - started


def _tensors(value, found):
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _tensors(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, found)
    elif isinstance(value, functools.partial):
        _tensors(value.args, found)
        _tensors(value.keywords, found)


def saved_bytes(model, batch):
    """What the forward keeps for backward, each storage counted once.

    ``saved``: tensors saved for backward (torch.autograd.graph.saved_tensors_hooks).
    ``held``: ``saved`` plus every tensor handed to a checkpoint call (positional
    inputs and those bound in its ``partial``): non-reentrant checkpointing keeps
    those alive through its recompute closure, where the hooks cannot see them,
    and reentrant keeps the non-grad ones (masks) the same way.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    saved, inputs = {}, {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)
              and m.__dict__.get("_gradient_checkpointing_func") is not None]
    originals = [layer.__dict__["_gradient_checkpointing_func"] for layer in layers]
    for layer, raw in zip(layers, originals):

        def recording(*args, _raw=raw, **kwargs):  # noqa: B023
            found = []
            _tensors(args, found)
            for tensor in found:
                storage = tensor.untyped_storage()
                inputs[storage.data_ptr()] = storage.nbytes()
            return _raw(*args, **kwargs)

        layer.__dict__["_gradient_checkpointing_func"] = recording
    model.zero_grad(set_to_none=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = model(**batch).loss
    finally:
        for layer, raw in zip(layers, originals):
            layer.__dict__["_gradient_checkpointing_func"] = raw
    loss.backward()
    return {"saved": sum(saved.values()), "held": sum({**inputs, **saved}.values()), "storages": len(saved)}


def _max_rss_bytes():
    """Peak RSS of this process image (VmHWM).  Not ru_maxrss: Linux carries that
    over from the parent across fork+exec, so a child of a big process would
    report the parent's size."""
    from hotfix.diagnostics.memory import proc_kib_field

    return proc_kib_field("/proc/self/status", "VmHWM")


def rss_child(variant):
    """Peak-RSS increase of one step, in a fresh process (ru_maxrss only grows)."""
    import hotfix  # noqa: F401  (the .pth has activated it already; explicit for clarity)

    model, batch = whisper_tiny()
    if variant != "reentrant":
        hotfix.revert()  # the upstream path for non-reentrant / no checkpointing
    set_checkpointing(model, variant)
    with torch.no_grad():
        model(**batch)  # allocate everything a forward needs once, outside the measured step
    before = _max_rss_bytes()
    seconds = step(model, batch)
    print(json.dumps({"variant": variant, "before": before, "peak": _max_rss_bytes(), "seconds": seconds}))



if __name__ == "__main__":
    if sys.argv[1:2] == ["rss"]:
        rss_child(sys.argv[2])
    else:
        raise SystemExit(__doc__)
