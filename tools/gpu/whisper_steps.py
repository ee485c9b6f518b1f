"""One variant of the GPU kit: Whisper training steps, measured, in a fresh interpreter.

    python tools/gpu/whisper_steps.py --mode unsloth --zoo DIR --dims test --dtype float32 \
        --batches 2 --steps 3 --compare

Prints one JSON line per batch size: status (ok / crash / oom / skipped), peak
CUDA memory of step 1 and of the steady state (``max_memory_allocated``, reset
before every step), median step time of steps 2.., whether unsloth's offload
line was printed during step 1, and (``--compare``) whether every trainable
parameter's gradient equals a step without checkpointing, step by step.

Modes: ``none`` (no checkpointing), ``non-reentrant`` (the forum workaround),
``unsloth`` (the unsloth-zoo release in ``--zoo`` swaps torch's reentrant
checkpoint for its offloading one, as ``use_gradient_checkpointing="unsloth"``
does), ``hf-offload`` (transformers >= 5.17 ``activation_checkpointing_enable(offload=True)``).
hotfix is on or off through the environment (``HOTFIX_DISABLE=1``: upstream).
On a CPU (the kit's self-test) the zoo release runs through tools/lab/zoo_loader.py's
CPU seam and the memory figures are null.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OFFLOAD_LINE = "Unsloth: Will smartly offload gradients to save VRAM!"

# name -> WhisperConfig keywords and input frames; "large-v3" is whisper-large-v3's shape.
DIMS = {
    "tiny-cpu": dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=8,
                     max_source_positions=10, vocab_size=100, frames=20),
    "test": dict(d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, num_mel_bins=80,
                 max_source_positions=1500, vocab_size=1000, frames=3000),
    "medium": dict(d_model=1024, encoder_layers=24, decoder_layers=24, encoder_attention_heads=16,
                   decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, num_mel_bins=80,
                   max_source_positions=1500, vocab_size=51865, frames=3000),
    "large-v3": dict(d_model=1280, encoder_layers=32, decoder_layers=32, encoder_attention_heads=20,
                     decoder_attention_heads=20, encoder_ffn_dim=5120, decoder_ffn_dim=5120, num_mel_bins=128,
                     max_source_positions=1500, vocab_size=51866, frames=3000),
}
LABEL_TOKENS = 32


def build(args, torch):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    dims = dict(DIMS[args.dims])
    frames = dims.pop("frames")
    config = WhisperConfig(**dims, max_target_positions=max(64, LABEL_TOKENS * 2), pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=1, dropout=0.0, attention_dropout=0.0,
                           activation_dropout=0.0)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = WhisperForConditionalGeneration(config)
    model = model.to(getattr(torch, args.dtype)).train()
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora, lora_alpha=args.lora, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0, init_lora_weights=False))
        model.enable_input_require_grads()
    return model, dims["num_mel_bins"], frames, dims["vocab_size"]


def batch_of(size, mels, frames, vocab, args, torch):
    g = torch.Generator(device="cpu").manual_seed(size)
    return {
        "input_features": torch.randn(size, mels, frames, generator=g).to(args.device, getattr(torch, args.dtype)),
        "labels": torch.randint(3, vocab, (size, LABEL_TOKENS), generator=g).to(args.device),
    }


def enable(model, args):
    if args.mode == "none":
        return
    if args.mode == "hf-offload":
        model.activation_checkpointing_enable(offload=True)
        return
    reentrant = args.mode == "unsloth"
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})


def load_zoo(args, torch):
    """The release in --zoo, with unsloth's swap of torch's reentrant checkpoint installed."""
    sys.path.insert(0, args.zoo)
    sys.path.insert(0, os.path.join(REPO, "tools", "lab"))
    import zoo_loader

    gc = zoo_loader.load_release()
    if args.device == "cuda":
        gc.patch_unsloth_smart_gradient_checkpointing(dtype=getattr(torch, args.dtype))  # real streams, pinned buffers
    else:
        zoo_loader.install_unsloth_swap(gc)
    return gc


def grads_of(model):
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()
            if p.requires_grad}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("none", "non-reentrant", "unsloth", "hf-offload"), required=True)
    p.add_argument("--zoo", help="directory holding an unsloth_zoo release (mode unsloth)")
    p.add_argument("--dims", choices=sorted(DIMS), default="test")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1", help="comma list; 'auto' doubles from 8 until out of memory")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lora", type=int, default=0, help="LoRA rank on q/v (0: full fine-tuning)")
    p.add_argument("--compare", action="store_true", help="compare every step's gradients with no checkpointing")
    p.add_argument("--compare-batches", default="", help="comma list: compare only at these batch sizes")
    p.add_argument("--time-budget", type=float, default=240.0)
    args = p.parse_args(argv)

    started = time.monotonic()
    import torch
    import transformers  # the start-up hook activates hotfix here (unless HOTFIX_DISABLE=1)

    if args.mode == "unsloth":
        load_zoo(args, torch)
    from hotfix.diagnostics.compare import compare_grads, short_error  # the one rule (None never equals zero)

    cuda = args.device == "cuda"
    model, mels, frames, vocab = build(args, torch)
    header = {"mode": args.mode, "dims": args.dims, "dtype": args.dtype, "lora": args.lora,
              "transformers": transformers.__version__, "torch": torch.__version__,
              "hotfix": os.environ.get("HOTFIX_DISABLE") != "1"}
    sizes = [s for s in args.batches.split(",") if s != "auto"]
    if "auto" in args.batches.split(","):
        sizes += [str(8 * 2 ** i) for i in range(4)]
    reference_cache = {}
    for text in sizes:
        size = int(text)
        row = dict(header, batch=size)
        if time.monotonic() - started > args.time_budget:
            print(json.dumps(dict(row, status="skipped", error="time budget")), flush=True)
            continue
        batch = batch_of(size, mels, frames, vocab, args, torch)
        compare = args.compare or text in args.compare_batches.split(",")
        try:
            if compare:
                model.gradient_checkpointing_disable()
                model.zero_grad(set_to_none=True)
                model(**batch).loss.backward()
                reference_cache[size] = grads_of(model)
            enable(model, args)
            peaks, times, equal, errors, message_step1, message_any = [], [], [], [], None, False
            for step in range(args.steps):
                model.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                captured = io.StringIO()
                t0 = time.perf_counter()
                with contextlib.redirect_stdout(captured):
                    model(**batch).loss.backward()
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                peaks.append(torch.cuda.max_memory_allocated() if cuda else None)
                printed = OFFLOAD_LINE in captured.getvalue()
                sys.stderr.write(captured.getvalue())
                message_step1 = printed if step == 0 else message_step1
                message_any = message_any or printed
                if compare:
                    report = compare_grads(reference_cache[size], grads_of(model))
                    equal.append(report.ok)
                    errors.append(report.max_error)
            steady = [p for p in peaks[1:] if p is not None]
            row.update(status="ok", step1_peak=peaks[0], steady_peak=max(steady) if steady else None,
                       median_s=sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0],
                       offload_message_step1=message_step1, offload_message_seen=message_any)
            if compare:
                row.update(grads_equal=equal, max_rel_error=max(errors))
        except torch.cuda.OutOfMemoryError as exc:
            row.update(status="oom", error=str(exc).splitlines()[0][:200])
        except Exception as exc:
            row.update(status="crash", error=short_error(exc))
        finally:
            model.zero_grad(set_to_none=True)
            batch = None
            if cuda:
                torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        if row["status"] == "oom" and "auto" in args.batches:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
