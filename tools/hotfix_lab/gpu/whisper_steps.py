"""One variant of the GPU kit: Whisper training steps, measured, in a fresh interpreter.

    python -P -m hotfix_lab.gpu.whisper_steps --mode unsloth --zoo DIR --dims test --dtype float32 \
        --batches 4 --steps 3 --compare --deterministic --noise-floor --offload-fp32 exact

Prints one JSON line per batch size: status (ok / crash / oom / skipped), peak
CUDA memory of step 1 and of the steady state (``max_memory_allocated``, reset
before every step), the process's peak host RSS, median step time of steps 2..,
whether unsloth's offload line was printed during step 1, and (``--compare``)
whether every trainable parameter's gradient equals a step without
checkpointing, step by step, by tools/hotfix_lab/gpu/equality.py's rule: at
``--deterministic`` (bit-identical repeats on CUDA) fp32 compares at 1e-6;
``--noise-floor`` measures two steps without checkpointing against each other
and ``--against non-reentrant`` measures ``use_reentrant=False`` against the
reference, both in this run (before unsloth's swap is installed), and the
bound becomes a small factor of what was measured where that is larger.  A missing
gradient is never equal.  ``--mutate drop-grad`` drops one gradient after each
checkpointed step (the kit's mutation check: the comparison must fail).
``--offload-fp32 exact`` sets UNSLOTH_OFFLOAD_FP32 for the release: from 2026.9.8 on
unsloth-zoo stores an offloaded fp32 layer input as bf16 by default (and measures it in
bf16 bytes against its 2 MiB cutoff), so an fp32 comparison at 1e-6 needs ``exact``;
earlier releases have no such setting and store the dtype they were set up for (each
row's ``offload_fp32``: what the release read, null where it reads nothing).

Modes: ``none`` (no checkpointing), ``non-reentrant`` (the forum workaround),
``unsloth`` (the unsloth-zoo release in ``--zoo`` swaps torch's reentrant
checkpoint for its offloading one, as ``use_gradient_checkpointing="unsloth"``
does), ``hf-offload`` (transformers >= 5.17
``activation_checkpointing_enable(offload=True)``).  ``--lora-scope decoder``
puts the adapters on the decoder only (the encoder frozen), a shape upstream
unsloth-zoo trains correctly: the benchmark's anchor.  ``--batches search``
looks for the largest batch that trains one step (doubling, then bisecting
between the last that fit and the first out of memory), one line per probe.
hotfix is on or off through the environment (``HOTFIX_DISABLE=1``: upstream).
On a CPU (the kit's self-test) the zoo release runs through
tools/hotfix_lab/infra/zoo_loader.py's CPU seam and the memory figures are null.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import resource
import sys
import time

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
LORA_TARGETS = {"all": ["q_proj", "v_proj"], "decoder": r".*decoder\.layers\.\d+\.(self_attn|encoder_attn)\.(q_proj|v_proj)"}


def build(args, torch):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    dims = dict(DIMS[args.dims])
    frames = dims.pop("frames")
    labels = getattr(args, "labels", LABEL_TOKENS)
    config = WhisperConfig(**dims, max_target_positions=max(64, labels * 2), pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=1, dropout=0.0, attention_dropout=0.0,
                           activation_dropout=0.0)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = WhisperForConditionalGeneration(config)
    model = model.to(getattr(torch, args.dtype)).train()
    if args.lora:
        from peft import LoraConfig, get_peft_model

        targets = LORA_TARGETS[getattr(args, "lora_scope", "all")]
        model = get_peft_model(model, LoraConfig(r=args.lora, lora_alpha=args.lora, target_modules=targets,
                                                 lora_dropout=0.0, init_lora_weights=False))
        model.enable_input_require_grads()
    return model, dims["num_mel_bins"], frames, dims["vocab_size"]


def batch_of(size, mels, frames, vocab, args, torch):
    g = torch.Generator(device="cpu").manual_seed(size)
    labels = getattr(args, "labels", LABEL_TOKENS)
    return {
        "input_features": torch.randn(size, mels, frames, generator=g).to(args.device, getattr(torch, args.dtype)),
        "labels": torch.randint(3, vocab, (size, labels), generator=g).to(args.device),
    }


def enable(model, args):
    if args.mode == "none":
        return
    if args.mode == "hf-offload":
        model.activation_checkpointing_enable(offload=True)
        return
    reentrant = args.mode == "unsloth"
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})


def disable(model):
    off = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
    with contextlib.redirect_stderr(io.StringIO()):  # 5.x: the old name's deprecation warning
        off()


def load_zoo(args, torch):
    """The release in --zoo, with unsloth's swap of torch's reentrant checkpoint installed."""
    offload_fp32 = getattr(args, "offload_fp32", None)  # soak.py and fit.py call this with their own arguments
    if offload_fp32:  # read by the release's initialize_unsloth_gradient_checkpointing (2026.9.8 on)
        os.environ["UNSLOTH_OFFLOAD_FP32"] = offload_fp32
    sys.path.insert(0, args.zoo)  # the release measured, first (zoo_loader loads it from sys.path)
    from hotfix_lab.infra import zoo_loader

    gc_module = zoo_loader.load_release()
    if args.device == "cuda":
        gc_module.patch_unsloth_smart_gradient_checkpointing(dtype=getattr(torch, args.dtype))  # real streams, pinned buffers
    else:
        zoo_loader.install_unsloth_swap(gc_module)
    return gc_module


#: what a system short of page-locked memory says (WSL2, unslothai/unsloth-zoo#1257): the allocator's RuntimeError
REFUSED = "CUDA error: out of memory (pinned host memory refused: tools/hotfix_lab/gpu/whisper_steps.py --refuse-pinned)"


def refuse_pinned_memory(torch):
    """Every ``torch.empty(..., pin_memory=True)`` raises, as cudaHostAlloc does where page-locked memory is scarce
    (unsloth's offload set-up and hotfix's offload pool allocate their host buffers this way)."""
    empty = torch.empty

    def empty_refusing_pinned(*args, **kwargs):
        if kwargs.get("pin_memory"):
            raise RuntimeError(REFUSED)
        return empty(*args, **kwargs)

    torch.empty = empty_refusing_pinned


def offload_fp32_read(gc_module):
    """How the loaded release stores offloaded fp32 layer inputs: "exact" or "bf16" (2026.9.8 on: its
    FP32_OFFLOAD_EXACT, from UNSLOTH_OFFLOAD_FP32, default bf16, and it then also measures an fp32 input in
    bf16 bytes against its 2 MiB cutoff), or None: the release has no such setting (it stores the dtype
    its buffers were made for, the --dtype here: exact)."""
    if "FP32_OFFLOAD_EXACT" not in vars(gc_module):
        return None
    return "exact" if gc_module.FP32_OFFLOAD_EXACT else "bf16"


def drop_one_gradient(model):
    """The mutation: one trainable parameter loses its gradient (an encoder layer's, where there is one)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is not None]
    name = next((n for n in names if "encoder.layers" in n), names[0] if names else None)
    if name is not None:
        dict(model.named_parameters())[name].grad = None


def host_peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def search_sizes(start, limit):
    """Batch sizes to probe, one at a time: ``send(fitted)`` after each; doubling from ``start`` while
    they fit, then bisecting between the last fit and the first out of memory to 1/16 of the fit."""
    low, high, size = 0, None, start
    while size and size <= limit:
        fitted = yield size
        if fitted:
            low = size
        else:
            high = size
        if high is None:
            size = size * 2
        elif high - low <= max(1, low // 16):
            return
        else:
            size = (low + high) // 2


def reference_grads(model, batch, torch):
    from hotfix.diagnostics.compare import collect_grads

    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    grads = collect_grads(model)
    model.zero_grad(set_to_none=True)
    return grads


def baseline(model, batch, args, torch):
    """What a checkpointed step at this batch is compared with, measured before unsloth's swap is installed
    (upstream, use_reentrant=False through a swapped torch fails on some releases: 2025.11.3, Whisper, a
    TypeError; the bound must not depend on hotfix): the reference gradients, the noise floor and the
    workaround's deviation, and the bound they give."""
    from hotfix_lab.gpu import equality

    found = {"reference": reference_grads(model, batch, torch)}
    floor = workaround = None
    if args.noise_floor:
        floor = found["noise_floor"] = equality.deviation(found["reference"], reference_grads(model, batch, torch))
    if args.against == "non-reentrant":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        try:
            workaround = equality.deviation(found["reference"], reference_grads(model, batch, torch))
        finally:
            disable(model)
        found["workaround_error"] = workaround
    found["bound"] = equality.allowed_error(args.dtype, floor, workaround)
    return found


def measure(model, batch, args, torch, against=None):
    """Step 1.. of the checkpointed model at one batch size: the row's measured fields (``against``: a
    :func:`baseline`, or None for no comparison)."""
    from hotfix_lab.gpu import equality
    from hotfix.diagnostics.compare import collect_grads

    cuda = args.device == "cuda"
    compare = against is not None
    row = {k: v for k, v in (against or {}).items() if k != "reference"}
    reference, bound = (against["reference"], against["bound"]) if compare else (None, None)
    enable(model, args)
    peaks, times, equal, errors, missing, message_step1, message_any = [], [], [], [], [], None, False
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
        if args.mutate == "drop-grad":
            drop_one_gradient(model)
        if compare:
            report = equality.judge(reference, collect_grads(model), bound)
            equal.append(report.ok)
            errors.append(report.max_error)
            missing.append(len(report.missing) + len(report.unexpected))
    steady = [p for p in peaks[1:] if p is not None]
    row.update(status="ok", step1_peak=peaks[0], steady_peak=max(steady) if steady else None,
               median_s=sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0],
               offload_message_step1=message_step1, offload_message_seen=message_any)
    if compare:
        row.update(grads_equal=equal, max_rel_error=max(errors), missing_grads=max(missing))
    return row


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("none", "non-reentrant", "unsloth", "hf-offload"), required=True)
    p.add_argument("--zoo", help="directory holding an unsloth_zoo release (mode unsloth)")
    p.add_argument("--dims", choices=sorted(DIMS), default="test")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1",
                   help="comma list; 'auto' doubles from 8 until out of memory; 'search' finds the largest that fits")
    p.add_argument("--search-from", type=int, default=64, help="--batches search: the first size probed")
    p.add_argument("--search-limit", type=int, default=4096, help="--batches search: never probe above this")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lora", type=int, default=0, help="LoRA rank on q/v (0: full fine-tuning)")
    p.add_argument("--lora-scope", choices=sorted(LORA_TARGETS), default="all")
    p.add_argument("--labels", type=int, default=LABEL_TOKENS, help="label tokens per example")
    p.add_argument("--compare", action="store_true", help="compare every step's gradients with no checkpointing")
    p.add_argument("--compare-batches", default="", help="comma list: compare only at these batch sizes")
    p.add_argument("--deterministic", action="store_true", help="tools/hotfix_lab/gpu/equality.py's bit-reproducible kernels")
    p.add_argument("--noise-floor", action="store_true", help="measure two steps without checkpointing (bound)")
    p.add_argument("--against", choices=("non-reentrant",), help="measure the workaround's deviation (bound)")
    p.add_argument("--mutate", choices=("drop-grad",), help="drop one gradient after each checkpointed step")
    p.add_argument("--offload-fp32", choices=("exact", "bf16"),
                   help="UNSLOTH_OFFLOAD_FP32 for the release (mode unsloth; read from 2026.9.8 on, whose default "
                        "bf16 stores offloaded fp32 inputs rounded); the row's offload_fp32 says what it read")
    p.add_argument("--refuse-pinned", action="store_true",
                   help="every pinned host allocation raises, as where page-locked memory is scarce (WSL2)")
    p.add_argument("--time-budget", type=float, default=240.0)
    args = p.parse_args(argv)

    started = time.monotonic()
    import torch
    import transformers  # the start-up hook activates hotfix here (unless HOTFIX_DISABLE=1)

    if args.deterministic:
        from hotfix_lab.gpu import equality

        equality.deterministic(torch)
    from hotfix.diagnostics.compare import short_error

    cuda = args.device == "cuda"
    model, mels, frames, vocab = build(args, torch)
    hotfix_module = sys.modules.get("hotfix")
    header = {"mode": args.mode, "dims": args.dims, "dtype": args.dtype, "lora": args.lora,
              "lora_scope": args.lora_scope, "labels": args.labels,
              "deterministic": args.deterministic, "transformers": transformers.__version__,
              "torch": torch.__version__, "hotfix": os.environ.get("HOTFIX_DISABLE") != "1",
              "hotfix_file": getattr(hotfix_module, "__file__", None)}
    if args.mutate:
        header["mutation"] = args.mutate
    searching = args.batches == "search"
    listed = [s for s in args.batches.split(",") if s not in ("auto", "search")]
    if "auto" in args.batches.split(","):
        listed += [str(8 * 2 ** i) for i in range(4)]
    baselines = {}  # size -> baseline() or the error that stopped it
    for text in listed:
        if args.compare or text in args.compare_batches.split(","):
            try:
                baselines[int(text)] = baseline(model, batch_of(int(text), mels, frames, vocab, args, torch), args, torch)
            except Exception as exc:
                baselines[int(text)] = "step without checkpointing: " + short_error(exc)
            model.zero_grad(set_to_none=True)
    if args.refuse_pinned:
        refuse_pinned_memory(torch)
        header["refuse_pinned"] = True
    if args.mode == "unsloth":
        try:
            header["offload_fp32"] = offload_fp32_read(load_zoo(args, torch))
        except RuntimeError as exc:  # unsloth's set-up (upstream: its pinned buffers, no fallback before 2026.9.5)
            print(json.dumps(dict(header, status="crash", error="set-up: " + short_error(exc))), flush=True)
            return 0
    if searching:
        sizes = search_sizes(args.search_from, args.search_limit)
        size = next(sizes, None)
    else:
        listed = iter(listed)
        size = next(listed, None)
    while size is not None:
        size = int(size)
        row = dict(header, batch=size)
        fitted = False
        against = baselines.get(size)
        if time.monotonic() - started > args.time_budget:
            row.update(status="skipped", error="time budget")
        elif isinstance(against, str):
            row.update(status="crash", error=against)
        else:
            if searching:  # tools/hotfix_lab/gpu/fit.py names the probe a time limit stopped
                print(json.dumps({"probing": size}), flush=True)
            batch = None
            try:
                batch = batch_of(size, mels, frames, vocab, args, torch)
                row.update(measure(model, batch, args, torch, against))
                fitted = True
            except torch.cuda.OutOfMemoryError as exc:
                row.update(status="oom", error=str(exc).splitlines()[0][:200])
            except Exception as exc:
                # pinned host memory running out is "out of memory" too (a RuntimeError of the allocator)
                row.update(status="oom" if "out of memory" in str(exc) else "crash", error=short_error(exc))
            finally:
                model.zero_grad(set_to_none=True)
                disable(model)
                batch = None
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
            row["host_peak_rss"] = host_peak_rss()
        print(json.dumps(row), flush=True)
        if searching:
            if row["status"] not in ("ok", "oom"):
                break
            try:
                size = sizes.send(fitted)
            except StopIteration:
                size = None
        elif row["status"] == "oom" and "auto" in args.batches:
            break
        else:
            size = next(listed, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
