"""One checkpointed model under ``torch.compile``, trained a few steps; one JSON line.

    python -P -m hotfix_lab.cases.compile_case --model whisper --backend eager [--function unsloth] [--device cuda]
                                     [--second-model same|non-reentrant]

The model (``whisper``: the doctor's tiny Whisper, keyword tensors into its decoder layers;
``whisper-qv``: the same with only q_proj/v_proj trainable; ``llama``: a tiny Llama, the layer shape of
every decoder-only model) takes one uncompiled step without
checkpointing (the reference), then reentrant checkpointing is enabled and ``torch.compile(model,
backend=...)`` takes ``--steps`` steps.  Each step's gradients are compared with the reference: every
trainable parameter, a missing gradient never equal to a zero one, each tensor within ``--rtol`` of the
reference's largest value (compiled code rounds differently; a checkpointing defect loses whole
gradients or changes them by far more).

hotfix is on or off through the environment, as for users: installed, its start-up hook activates it
(``HOTFIX_DISABLE=1``: upstream).  ``--function unsloth``: unsloth-zoo's ``UnslothCheckpointFunction``
(the release on PYTHONPATH) replaces torch's reentrant one first, as unsloth does (on CPU through
tools/hotfix_lab/infra/zoo_loader.py's seam, on CUDA with its real streams).

The line: ``status`` (equal: every step equal | differs | crash | n/a: the model or function cannot
be built here | error), per-step ``equal``, ``missing``, ``max_rel``, and dynamo's counts: ``graphs``
(unique graphs), ``breaks`` (graph breaks), ``frames`` (frames compiled), ``recompiles`` (frames compiled
after step 1: a steady loop compiles nothing new), ``hotfix_in_breaks`` (a graph break names hotfix's
wrapper), ``hotfix`` (active in this process), versions.
Compare a hotfix-off and a hotfix-on run of the same case: the counts must match.  The census's
compile column (tools/hotfix_lab/census/census.py), tests/e2e/test_torch_compile.py and
tests/versions/test_torch_lines.py run it; on a GPU it runs as is with ``--device cuda``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

def llama(seed=0):
    """A tiny LlamaForCausalLM: two decoder layers (rotary embeddings, causal mask, tied to nothing)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                      attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).train()
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(3, 100, (2, 7), generator=g)
    return model, {"input_ids": ids, "labels": ids.clone()}


def whisper(seed=0):
    from hotfix_lab.infra import tiny_models

    model, batch = tiny_models.whisper(seed)
    model.config.dropout = 0.0
    return model, batch


def whisper_qv(seed=0):
    """LoRA-like: only q_proj/v_proj train, so nothing reaching a layer needs grad (frozen-inputs' case)."""
    model, batch = whisper(seed)
    for name, p in model.named_parameters():
        p.requires_grad_(name.split(".")[-2] in ("q_proj", "v_proj"))
    return model, batch


BUILDERS = {"whisper": whisper, "whisper-qv": whisper_qv, "llama": llama}


def _grads(model):
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()
            if p.requires_grad}


def _compare(reference, got, rtol):
    """(equal, missing, max_rel): ``missing`` counts parameters whose gradient is None on one side only."""
    missing = sum(1 for k in reference if (reference[k] is None) != (got.get(k) is None))
    worst = 0.0
    for k, ref in reference.items():
        if ref is None or got.get(k) is None:
            continue
        scale = ref.abs().max().clamp_min(1e-12)
        worst = max(worst, ((ref - got[k].to(ref.device)).abs().max() / scale).item())
    return missing == 0 and worst <= rtol, missing, worst


def _sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def run(args) -> dict:
    import torch

    out = dict(model=args.model, backend=args.backend, function=args.function, device=args.device,
               torch=torch.__version__.split("+")[0])
    if args.device == "cuda":  # reproducible math: no TF32, no fused attention kernels with their own rounding
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
    import transformers
    import torch._dynamo
    from torch._dynamo.utils import counters

    out["transformers"] = transformers.__version__
    try:
        if args.function == "unsloth":
            from hotfix_lab.infra import zoo_loader

            gc = zoo_loader.load_release()
            if args.device == "cuda":
                gc.patch_unsloth_smart_gradient_checkpointing(dtype=torch.float32)
            else:
                zoo_loader.install_unsloth_swap(gc)
            out["unsloth_zoo"] = getattr(sys.modules.get("unsloth_zoo"), "__version__", None) or _zoo_version()
        model, batch = BUILDERS[args.model](0)
    except (ImportError, AttributeError, SystemExit) as exc:
        out.update(status="n/a", error=f"{type(exc).__name__}: {exc}"[:300])
        return out
    registry = sys.modules.get("hotfix.registry")  # the start-up hook activated it with transformers
    out["hotfix"] = bool(registry is not None and registry.registry.active)
    model.to(args.device)
    batch = {k: v.to(args.device) for k, v in batch.items()}
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    reference = _grads(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    # --second-model: another model of the type with checkpointing enabled, alive while this one trains (a
    # policy beside a reference model, two runs in one notebook).  The layers of the two hold two checkpoint
    # functions: ``same`` (reentrant too) binds the same options, which hotfix's slot hands dynamo as one;
    # ``non-reentrant`` another, so each layer reads its own (hotfix/checkpointing/slot.py)
    second = BUILDERS[args.model](1)[0] if args.second_model else None
    if second is not None:
        second.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": args.second_model == "same"})
        out["second_model"] = args.second_model
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=args.backend)
    steps, frames_after_first = [], 0
    try:
        for step in range(args.steps):
            model.zero_grad(set_to_none=True)
            began = time.perf_counter()
            compiled(**batch).loss.backward()
            _sync(torch, args.device)
            equal, missing, worst = _compare(reference, _grads(model), args.rtol)
            steps.append(dict(equal=equal, missing=missing, max_rel=worst, seconds=round(time.perf_counter() - began, 3)))
            if step == 0:
                frames_after_first = counters["frames"]["ok"]
    except Exception as exc:  # the crash is the finding: one line says which
        first = (str(exc).strip().splitlines() or [""])[0]
        out.update(status="crash", error=f"{type(exc).__name__}: {first}"[:300], steps=steps)
        if args.traceback:
            traceback.print_exc()
        return out
    out.update(
        status="equal" if all(s["equal"] for s in steps) else "differs",
        steps=steps,
        missing=max(s["missing"] for s in steps),
        max_rel=max(s["max_rel"] for s in steps),
        graphs=counters["stats"]["unique_graphs"],
        breaks=sum(counters["graph_break"].values()),
        frames=counters["frames"]["ok"],
        recompiles=counters["frames"]["ok"] - frames_after_first,
        hotfix_in_breaks=any("FunctionWrapper" in reason or "hotfix" in reason for reason in counters["graph_break"]),
    )
    return out


def _zoo_version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("unsloth_zoo")
    except PackageNotFoundError:
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(BUILDERS), default="whisper")
    p.add_argument("--backend", default="eager", help="eager | aot_eager | inductor")
    p.add_argument("--function", choices=("torch", "unsloth"), default="torch")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--second-model", choices=("same", "non-reentrant"), default=None,
                   help="a second model of the type with checkpointing enabled (reentrant too, or not), alive "
                        "while the first trains")
    p.add_argument("--traceback", action="store_true", help="print a crash's traceback on stderr")
    args = p.parse_args(argv)
    try:
        out = run(args)
    except Exception as exc:  # outside the compiled steps: the case could not be set up
        out = dict(model=args.model, backend=args.backend, function=args.function, device=args.device,
                   status="error", error=f"{type(exc).__name__}: {exc}"[:300])
        if args.traceback:
            traceback.print_exc()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
