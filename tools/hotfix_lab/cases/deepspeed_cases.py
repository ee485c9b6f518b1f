"""Training under DeepSpeed ZeRO-2 / ZeRO-3 with gradient checkpointing: the cases of issue 42, part 1.

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 -m hotfix_lab.cases.deepspeed_cases RESULT_DIR CASE...

CPU (DeepSpeed's CPU accelerator, gloo where oneCCL is absent; the caller sets loopback: MASTER_ADDR=127.0.0.1,
GLOO_SOCKET_IFNAME=lo), or where DeepSpeed's accelerator is CUDA the rank's GPU and NCCL (the GPU kit's 1-GPU
case), with DeepSpeed on PYTHONPATH (installed from its sdist with DS_BUILD_OPS=0: no C++ op is
built).  Case names: ``zero{2,3}:{lora,full,whisper,whisper-lora}:{reentrant,nonreentrant,deepspeed,
deepspeed-partitioned,deepspeed-cpu}`` (``deepspeed``: DeepSpeed's own ``deepspeed.checkpointing.checkpoint`` as the
layers' checkpoint function, set as a user would with transformers' ``_set_gradient_checkpointing``; ``-partitioned``:
with its ``activation_checkpointing`` options ``partition_activations`` and ``cpu_checkpointing`` on; ``-cpu``:
``cpu_checkpointing`` alone, an accelerator's path: on the CPU accelerator DeepSpeed's host copy of an input is the
input itself, emptied with it, so there the host copy is made a tensor of its own, as an accelerator's is:
``deepspeed_env.stand_in_host_copy``), and
``trainer-zero{2,3}:whisper:{reentrant,nonreentrant}``: transformers' Seq2SeqTrainer with a ``deepspeed`` config
(its losses compared where the other cases compare gradients).  Each case builds the model
twice, the same seed, and trains each through ``deepspeed.initialize`` (fp32, a client SGD optimizer, each rank on
its share of one batch) for two steps: once without checkpointing (the reference), once with transformers'
gradient checkpointing in that mode.  Compared: every trainable parameter's full gradient after the first backward
(``deepspeed.utils.safe_get_full_grad``: gathered across ranks; a parameter without one equals only one without)
and every trainable parameter after the second step (``safe_get_full_fp32_param``).  Each rank writes
RESULT_DIR/rank<N>.json: {"rank", "world", "hotfix_loaded", "torch", "transformers", "deepspeed", "cases": {CASE:
{"ok", "equal", "missing", "wrong", "params_equal", "summary"} or {"ok": false, "error"}}}.  The script never
mentions hotfix (the start-up hook activates it on ``import transformers``; HOTFIX_DISABLE=1 gives upstream).
"""

from __future__ import annotations

import os
import sys

import torch

import transformers  # the start-up hook activates hotfix here, where installed

HOTFIX_LOADED = "hotfix" in sys.modules
import deepspeed  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad  # noqa: E402

from hotfix_lab.cases import ddp_cases  # noqa: E402  (tools/hotfix_lab, beside this file: the tiny models and hotfix's comparison rule)
from hotfix_lab.infra import deepspeed_env  # noqa: E402  (tools/hotfix_lab)
from hotfix_lab.infra import rank_results  # noqa: E402

RTOL = 1e-5
STEPS = 2


def config(stage: int, world: int) -> dict:
    return {"train_micro_batch_size_per_gpu": ddp_cases.BATCH // world, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
            "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}


def model_for(recipe: str, mode: str):
    """``lora``/``full``: a tiny Llama (PEFT LoRA with the input hook, or every parameter); ``whisper``: a tiny Whisper,
    every parameter (its decoder's ``encoder_hidden_states=`` by keyword); ``whisper-lora``: LoRA without the hook;
    ``moe``: a tiny Qwen3-MoE with moe_cases' drift device (its routers tied, scaled apart in a recomputation only)."""
    if recipe == "whisper":
        from hotfix_lab.infra import tiny_models

        model = tiny_models.whisper()[0]
    elif recipe == "moe":
        from hotfix_lab.cases import moe_cases

        model = moe_cases.build("qwen3_moe")[0]
        # as a ZeRO-3 user of a MoE must (transformers' DeepSpeed docs): its sparse block a leaf, every expert gathered
        # at once; otherwise ranks routing to different experts gather different parameters (gloo: a size mismatch)
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, [type(model.model.layers[0].mlp)])
    else:
        model = ddp_cases.build(recipe, False, False)
    if mode.startswith("deepspeed"):  # DeepSpeed's own checkpoint function in transformers' place (issue 42, part 4)
        model.gradient_checkpointing_enable()
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
    elif mode != "none":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": mode == "reentrant"})
    return model


def train(recipe: str, mode: str, stage: int, rank: int, world: int):
    """(full gradients after the first backward, full parameters after the last step), by parameter name."""
    model = model_for(recipe, mode)
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in trainable], lr=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config(stage, world))
    if mode == "deepspeed-cpu" and not torch.cuda.is_available():
        deepspeed_env.stand_in_host_copy()
    if mode.startswith("deepspeed"):
        # its function reads its options from module state: set from a config's "activation_checkpointing" section
        # as a user does (``deepspeed.checkpointing.configure``), both off for ``deepspeed`` (its defaults)
        partitioned = mode == "deepspeed-partitioned"
        on_host = mode in ("deepspeed-partitioned", "deepspeed-cpu")  # -cpu: cpu_checkpointing alone (its GPU path)
        deepspeed.checkpointing.configure(None, deepspeed_config={**config(stage, world), "activation_checkpointing": {
            "partition_activations": partitioned, "cpu_checkpointing": on_host}})
    if recipe == "whisper":
        from hotfix_lab.infra import tiny_models

        whole = tiny_models.whisper()[1]
    elif recipe == "moe":
        # 4 rows of 12 tokens per rank: every rank's tokens reach every expert group the forward picks from, so the
        # ranks reduce the same experts' gradients (ZeRO buckets its reduction by the parameters that got one; ranks
        # whose tokens reach different experts mismatch, DeepSpeed alone: gloo "Received data size doesn't match")
        ids = torch.randint(0, 64, (4 * world, 12), generator=torch.Generator().manual_seed(1))
        whole = {"input_ids": ids, "labels": ids.clone()}
    else:
        whole = ddp_cases.batch(recipe)
    mine = {key: value.chunk(world)[rank].to(engine.device) for key, value in whole.items()}
    first = {}
    for step in range(STEPS):
        loss = engine(**mine).loss
        engine.backward(loss)
        if step == 0:
            for name, p in trainable:
                grad = safe_get_full_grad(p)
                first[name] = None if grad is None else grad.detach().to("cpu", copy=True)
        engine.step()
    final = {name: safe_get_full_fp32_param(p).detach().to("cpu", copy=True) for name, p in trainable}
    engine.destroy()
    return first, final


def trainer(recipe: str, mode: str, stage: int, rank: int, world: int):
    """transformers' Seq2SeqTrainer with a ``deepspeed`` config (tiny Whisper, DeepSpeed's AdamW in torch, 2 steps);
    (the losses, every trainable parameter after training), as case() compares them."""
    from hotfix_lab.infra import tiny_models
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    model, whole = tiny_models.whisper()
    rows = [{key: value[i] for key, value in whole.items()} for i in range(len(whole["labels"]))] * world

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, index):
            return rows[index]

    settings = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                "zero_optimization": {"stage": stage}, "fp16": {"enabled": False}, "bf16": {"enabled": False},
                "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}}}
    checkpointing = {} if mode == "none" else {"gradient_checkpointing": True,
                                               "gradient_checkpointing_kwargs": {"use_reentrant": mode == "reentrant"}}
    args = Seq2SeqTrainingArguments(output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ds-trainer-{rank}"),
                                    per_device_train_batch_size=len(whole["labels"]) // world, max_steps=STEPS,
                                    learning_rate=1e-3, report_to=[], save_strategy="no", logging_steps=1,
                                    use_cpu=not torch.cuda.is_available(), deepspeed=settings, seed=0,
                                    **checkpointing)
    run = Seq2SeqTrainer(model=model, args=args, train_dataset=Rows())
    run.train()
    losses = {f"loss {i}": torch.tensor(entry["loss"]) for i, entry in enumerate(run.state.log_history)
              if "loss" in entry}
    final = {name: safe_get_full_fp32_param(p).detach().to("cpu", copy=True)
             for name, p in run.model.named_parameters() if p.requires_grad}
    run.model_wrapped.destroy()
    return losses, final


def case(name: str, rank: int, world: int) -> dict:
    stage, recipe, mode = name.split(":")
    if stage.startswith("trainer-"):  # trainer-zero<N>: the Trainer's own loop; its losses stand for the gradients
        stage = int(stage.removeprefix("trainer-zero"))
        ref_losses, ref_params = trainer(recipe, "none", stage, rank, world)
        losses, params = trainer(recipe, mode, stage, rank, world)
        found = ddp_cases.report(ref_losses, losses)
        after = ddp_cases.compare_rule.compare_grads(ref_params, params, rtol=RTOL)
        return dict(ok=True, trainable=len(ref_params), params_equal=after.ok, params_summary=after.summary(),
                    **found)
    stage = int(stage.removeprefix("zero"))
    ref_grads, ref_params = train(recipe, "none", stage, rank, world)
    grads, params = train(recipe, mode, stage, rank, world)
    found = ddp_cases.report(ref_grads, grads)
    after = ddp_cases.compare_rule.compare_grads(ref_params, params, rtol=RTOL)
    return dict(ok=True, trainable=len(ref_grads), params_equal=after.ok, params_summary=after.summary(), **found)


def main():
    result_dir, cases = sys.argv[1], sys.argv[2:]
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name())
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank, "world": world, "hotfix_loaded": HOTFIX_LOADED, "torch": torch.__version__,
           "device": accelerator.device_name(), "backend": accelerator.communication_backend_name(),
           "transformers": transformers.__version__, "deepspeed": deepspeed.__version__, "cases": {}}
    rank_results.run_cases(out, cases, lambda name: case(name, rank, world), ddp_cases.compare_rule.short_error,
                           dist.barrier)
    rank_results.write_rank_file(result_dir, out)


if __name__ == "__main__":
    main()
    rank_results.leave()  # as ddp_cases.py
