"""transformers layers checkpointed by torch's ``checkpoint_wrapper``: the cases of torch-checkpoint-wrapper.

    python -P -m hotfix_lab.cases.wrapper_cases RESULT_DIR CASE [CASE ...]                       (one process)
    python -m torch.distributed.run --nproc_per_node 2 -m hotfix_lab.cases.wrapper_cases RESULT_DIR CASE [CASE ...]

CPU and gloo (the caller sets loopback: MASTER_ADDR=127.0.0.1), or where CUDA is available the rank's GPU
and NCCL (the GPU kit).  Each process writes RESULT_DIR/rank<N>.json: {"rank", "world", "hotfix_loaded",
"torch", "transformers", "cases": {CASE: {"ok", "equal", "missing", "wrong", "summary", ...} or {"ok": false,
"error"}}}.  The script never mentions hotfix (the start-up hook activates it on ``import transformers``;
HOTFIX_DISABLE=1 gives upstream).

Case names: ``ENGINE:MODEL:IMPL``.  Each case trains the model one step twice, under the same ENGINE: once
without checkpointing (the reference), once with every ``GradientCheckpointingLayer`` wrapped by
``apply_activation_checkpointing(model, checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=IMPL))``
as accelerate's FSDP plugin, Lightning and torchtitan do, the config's ``use_cache`` left as the user has it.
Every trainable parameter's gradient is compared (hotfix's one rule: a missing gradient never equals a zero one).

* ENGINE ``plain``: one process, no distribution; ``fsdp2``: ``fully_shard`` on each wrapped layer and the
  model (torch's FSDP2; gloo on CPU), each rank on its share of the batch, gradients gathered
  (``full_tensor``); ``fsdp``: FSDP1 (``FullyShardedDataParallel``, ``use_orig_params=True``, each wrapped
  layer its own unit): needs an accelerator (torch's FSDP1 refuses the CPU).
* MODEL ``gpt2``: a tiny GPT-2 (its blocks get the Cache positionally); ``llama``: a tiny Llama, ``use_cache`` at its config's default (True); ``llama-nocache``: the same
  with ``use_cache=False`` (the workaround users are told); ``whisper``: a tiny Whisper, full fine-tuning;
  ``whisper-lora``: the same with PEFT LoRA on q_proj/v_proj and no input hook (its encoder layers get no
  input needing grad).
* IMPL ``reentrant`` / ``no_reentrant``: ``CheckpointImpl.REENTRANT`` / ``NO_REENTRANT``.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys

import torch
import torch.distributed as dist

import transformers  # the start-up hook activates hotfix here, where installed

HOTFIX_LOADED = "hotfix" in sys.modules  # nothing but the start-up hook can have loaded it
from hotfix_lab.infra import rank_results  # noqa: E402  (tools/hotfix_lab, beside this file)
from hotfix_lab.infra import standalone  # noqa: E402

compare_rule = standalone.load("compare")  # hotfix's one rule, loaded without importing hotfix

RTOL = 1e-5
DEVICE = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available()
          else torch.device("cpu"))
WRAPPED = "._checkpoint_wrapped_module"
#: a case whose model has no GradientCheckpointingLayer (transformers 4.52's Whisper): nothing to wrap, no result
NOT_WRAPPED = "not wrapped: no GradientCheckpointingLayer"


def build(model_name):
    """``(model, batch)``, seeded: the same weights and batch for the reference and the checkpointed run."""
    from hotfix_lab.cases import ddp_cases
    from hotfix_lab.infra import tiny_models

    if model_name.startswith("llama"):
        model = ddp_cases.tiny_llama()
        if model_name == "llama-nocache":
            model.config.use_cache = False
        ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(0))
        return model, {"input_ids": ids, "labels": ids.clone()}
    if model_name == "gpt2":  # its block takes the Cache positionally (GPT2Model passes it so)
        config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(0))
        return model, {"input_ids": ids, "labels": ids.clone()}
    if model_name == "whisper":
        model, batch = tiny_models.whisper()
    elif model_name == "whisper-lora":
        model, batch = tiny_models.whisper_lora_no_hook()
    else:
        raise ValueError(f"unknown model {model_name!r}")
    # two more samples: two ranks take one half each
    g = torch.Generator().manual_seed(7)
    return model, {"input_features": torch.cat([batch["input_features"], torch.randn(2, 8, 20, generator=g)]),
                   "labels": torch.cat([batch["labels"], torch.randint(3, 100, (2, 5), generator=g)])}


def wrap_layers(model, impl):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl,
                                                                             apply_activation_checkpointing,
                                                                             checkpoint_wrapper)
    from transformers.modeling_layers import GradientCheckpointingLayer

    impl = {"reentrant": CheckpointImpl.REENTRANT, "no_reentrant": CheckpointImpl.NO_REENTRANT}[impl]
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                                                  checkpoint_impl=impl),
                                   check_fn=lambda module: isinstance(module, GradientCheckpointingLayer))
    return model


def layers_of(model):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, CheckpointWrapper)] or \
        [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def shard(model, engine):
    if engine == "plain":
        return model
    if engine == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch < 2.6
            from torch.distributed._composable.fsdp import fully_shard

        mesh = init_device_mesh(DEVICE.type, (dist.get_world_size(),))
        for layer in layers_of(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if engine == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        classes = {type(layer) for layer in layers_of(model)}
        return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy(classes), use_orig_params=True,
                                        device_id=DEVICE if DEVICE.type == "cuda" else None)
    raise ValueError(f"unknown engine {engine!r}")


def grads(model):
    found = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        grad = parameter.grad
        if grad is not None and hasattr(grad, "full_tensor"):  # FSDP2: a DTensor shard
            grad = grad.full_tensor()
        name = name.replace(WRAPPED, "").replace("_fsdp_wrapped_module.", "")
        found[name] = None if grad is None else grad.detach().to("cpu", copy=True)
    return found


def step(case, checkpointed):
    engine, model_name, impl = case.split(":")
    model, batch = build(model_name)
    if checkpointed:
        wrap_layers(model, impl)
        if not layers_of(model) or not any(type(m).__name__ == "CheckpointWrapper" for m in model.modules()):
            raise LookupError(f"{NOT_WRAPPED} in this model on this release")
    model = shard(model.to(DEVICE), engine)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = {key: value.chunk(world)[rank].to(DEVICE) for key, value in batch.items()}
    model(**mine).loss.backward()
    return grads(model)


def run_case(case):
    reference = step(case, checkpointed=False)
    candidate = step(case, checkpointed=True)
    found = compare_rule.compare_grads(reference, candidate, rtol=RTOL)
    return {"ok": True, "equal": found.ok, "missing": len(found.missing), "unexpected": len(found.unexpected),
            "wrong": len(found.wrong), "max_error": found.max_error, "summary": found.summary()}


def main():
    result_dir, cases = sys.argv[1], sys.argv[2:]
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo" if DEVICE.type == "cpu" else "nccl", timeout=datetime.timedelta(seconds=120))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    out = {"rank": rank, "world": world, "hotfix_loaded": HOTFIX_LOADED, "device": str(DEVICE),
           "torch": torch.__version__, "transformers": transformers.__version__, "cases": {}}
    rank_results.run_cases(out, cases, run_case, compare_rule.short_error, dist.barrier if distributed else None)
    rank_results.write_rank_file(result_dir, out, distributed)


if __name__ == "__main__":
    main()
    rank_results.leave()  # as tools/hotfix_lab/cases/ddp_cases.py
