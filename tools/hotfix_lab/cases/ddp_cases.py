"""Training under DDP with ``find_unused_parameters=True``: the cases of transformers-ddp-find-unused.

    python -m torch.distributed.run --nproc_per_node 2 -m hotfix_lab.cases.ddp_cases RESULT_DIR CASE [CASE ...]

CPU and gloo (the caller sets loopback: MASTER_ADDR=127.0.0.1, GLOO_SOCKET_IFNAME=lo), or where CUDA
is available the rank's GPU (LOCAL_RANK) and NCCL (the GPU kit's 1-GPU case).  One rank without
torchrun: RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=<free port> python ddp_cases.py ...
(DDP's search and its "ready" marks are local to a rank: one rank shows the defect too).  Each rank
writes RESULT_DIR/rank<N>.json: {"rank", "world", "hotfix_loaded", "device", "torch", "transformers",
"cases": {CASE: {"ok", "equal", "missing", "unexpected", "wrong", "max_error", ...} or {"ok": false,
"error"}}}.
The script never mentions hotfix (the start-up hook activates it on ``import transformers``;
HOTFIX_DISABLE=1 gives upstream).

A plain-loop case trains a tiny Llama twice in the same process group, both wrapped in
``DistributedDataParallel(find_unused_parameters=True)``, each rank on its half of one batch: once
without checkpointing (the reference), once with reentrant checkpointing.  Every trainable
parameter's gradient after DDP's all-reduce is compared (hotfix's one rule: a missing gradient never
equals a zero one).  Case names: ``[unsloth:]{lora,full,whisper-lora}[+unused][+no_sync][+static_graph]``:

* ``lora``: PEFT LoRA on q_proj/v_proj (random B), ``enable_input_require_grads()``; ``full``: every
  parameter trains; ``whisper-lora``: tiny Whisper, LoRA on q_proj/v_proj without the input hook
  (the encoder layers' inputs need no grad, the decoder gets ``encoder_hidden_states=`` by keyword:
  the other transformers fixes act on the same calls);
* ``+unused``: a trainable parameter inside a checkpointed layer and a trainable module outside the
  layers that the forward never uses (no gradient, on every rank);
* ``+no_sync``: gradient accumulation, the first of two micro-batches under ``ddp.no_sync()``;
* ``+static_graph``: ``static_graph=True`` as well;
* ``unsloth:``: through unsloth-zoo's ``UnslothCheckpointFunction`` (the release on PYTHONPATH, loaded on
  CPU by zoo_loader.py with unsloth's own swap of torch's CheckpointFunction).  These come after
  the torch cases: the swap is process-wide.  ``unsloth:direct:...``: a ``direct:`` case (below) after the
  swap: the blocks' and the remote-code model's own ``checkpoint`` calls reach unsloth's class, as unsloth's
  own model code's do.

``fork:<function>:{lora,full}``: checkpointing turned on through a fork's checkpoint function as the fork does
(hotfix_lab.infra.fork_loader: ``llamafactory-unsloth``, ``axolotl-offload``, ...; the release on PYTHONPATH; axolotl's
replaces transformers' ``checkpoint`` for the process: its cases come last).

``trainer-lora``: transformers' Trainer with ``gradient_checkpointing=True`` over the LoRA model
(the Trainer picks ``find_unused_parameters=True`` itself for a PEFT model: recorded), 3 steps,
against the same Trainer without checkpointing: losses and every LoRA weight after training.
``sft-lora``: the same with TRL's SFTTrainer (``peft_config``), where TRL is on PYTHONPATH.
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

#: tolerance: DDP averages both runs the same way; recomputation repeats the same kernels
RTOL = 1e-5
#: this rank's device: its GPU where CUDA is available (NCCL), else the CPU (gloo)
DEVICE = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available()
          else torch.device("cpu"))
TRAINER_DEVICE = {"use_cpu": True, "ddp_backend": "gloo"} if DEVICE.type == "cpu" else {"ddp_backend": "nccl"}
BATCH, LENGTH = 4, 8


def tiny_llama(seed=0, **sizes):
    """A 2-layer Llama (every layer a checkpointed GradientCheckpointingLayer), random weights; ``sizes``
    override LlamaConfig's (the benchmark's larger model)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**dict(dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32),
                                **sizes))
    return LlamaForCausalLM(config).train()


def with_lora(model, seed=0, rank=4):
    import torch.distributed.tensor  # noqa: F401  PEFT reads torch.distributed.tensor.DTensor without
    # importing it; newer transformers lines import it first, 4.43 - 4.46 do not (AttributeError)
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed + 1)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)  # random B: every LoRA weight gets a non-zero gradient
    return get_peft_model(model, config).train()


def add_unused(model):
    """A trainable parameter in the first checkpointed layer and a trainable module outside, both never used."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = base.model.layers if hasattr(base.model, "layers") else base.model.encoder.layers
    layers[0].register_parameter("never_used", torch.nn.Parameter(torch.ones(4)))
    base.never_used_head = torch.nn.Linear(4, 4)
    return model


def build(recipe, unused, checkpointing):
    if recipe == "whisper-lora":
        from hotfix_lab.infra import tiny_models

        model, _ = tiny_models.whisper_lora_no_hook()
        return model_with(model, unused, checkpointing)
    model = tiny_llama()
    if recipe == "lora":
        model = with_lora(model)
        model.enable_input_require_grads()
    return model_with(model, unused, checkpointing)


def model_with(model, unused, checkpointing):
    if unused:
        add_unused(model)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    return model.to(DEVICE)


def batch(recipe, seed=0):
    if recipe == "whisper-lora":
        from hotfix_lab.infra import tiny_models

        return tiny_models.whisper_lora_no_hook()[1]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (BATCH, LENGTH), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def grads(model):
    return {name: None if p.grad is None else p.grad.detach().to("cpu", copy=True)
            for name, p in model.named_parameters() if p.requires_grad}


def report(reference, candidate):
    found = compare_rule.compare_grads(reference, candidate, rtol=RTOL)
    return {"equal": found.ok, "missing": len(found.missing), "unexpected": len(found.unexpected),
            "wrong": len(found.wrong), "max_error": found.max_error, "summary": found.summary(),
            "without_gradient": sorted(name for name, g in candidate.items() if g is None)}


def ddp_step(model, mine, no_sync, **ddp_kwargs):
    """One optimizer step's gradients under DDP; ``no_sync``: two micro-batches, the first not synchronised."""
    device_ids = [DEVICE.index] if DEVICE.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=True,
                                                    **ddp_kwargs)
    if no_sync:
        halves = [{key: value.chunk(2)[i] for key, value in mine.items()} for i in range(2)]
        with ddp.no_sync():
            ddp(**halves[0]).loss.backward()
        ddp(**halves[1]).loss.backward()
    else:
        ddp(**mine).loss.backward()
    return grads(model)


def plain_case(name, rank, world):
    variant = name.split(":")[-1].split("+")
    recipe, options = variant[0], set(variant[1:])
    mine = {key: value.chunk(world)[rank].to(DEVICE) for key, value in batch(recipe).items()}
    ddp_kwargs = {"static_graph": True} if "static_graph" in options else {}
    no_sync = "no_sync" in options
    reference = ddp_step(build(recipe, "unused" in options, False), mine, no_sync, **ddp_kwargs)
    if name.startswith("fork:"):  # checkpointing turned on through the fork, as the fork does
        candidate_model = build(recipe, "unused" in options, False)
        fork_enable(name.split(":")[1])(candidate_model)
    else:
        candidate_model = build(recipe, "unused" in options, True)
    candidate = ddp_step(candidate_model, mine, no_sync, **ddp_kwargs)
    return dict(ok=True, trainable=len(reference), **report(reference, candidate))


def fork_enable(function):
    """hotfix_lab.infra.fork_loader's enabler of ``function`` (a fork's checkpoint function: llamafactory-unsloth,
    axolotl-offload, ...), the fork's release loaded from PYTHONPATH once."""
    from hotfix_lab.infra import fork_loader

    enable, why = fork_loader.enabler(function, fork_module(fork_loader.FUNCTIONS[function][0]))
    if enable is None:
        raise RuntimeError(why)
    return enable


@functools.lru_cache(maxsize=None)
def fork_module(fork):
    from hotfix_lab.infra import fork_loader

    return fork_loader.load(fork)


# --- torch's checkpoint called directly (torch-ddp-find-unused), and a mixture of experts (DDP's advice)

class Blocks(torch.nn.Module):
    """A plain module whose blocks call torch's reentrant checkpoint themselves, with a parameter never used (why
    find_unused_parameters=True is set)."""

    def __init__(self, checkpointing):
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Linear(8, 8)  # the blocks' input needs grad, as after an embedding
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
                                          for _ in range(3))
        self.head = torch.nn.Linear(8, 1)
        self.never_used = torch.nn.Linear(8, 8)
        self.checkpointing = checkpointing

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True) if self.checkpointing else block(x)
        return self.head(x).square().mean()


def remote_code_model(checkpointing):
    """A PreTrainedModel as Hub modeling files write it (trust_remote_code): ``gradient_checkpointing_enable()``,
    then its own forward calls the ``checkpoint`` its module imported at the top (a name bound at import time)."""
    from hotfix_lab.infra import remote_code_model as remote  # tools/hotfix_lab: its module imports checkpoint at module level

    torch.manual_seed(0)
    model = remote.TinyRemoteModel(remote.TinyRemoteConfig()).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    return model


def tiny_mixtral(checkpointing):
    """A 2-layer Mixtral, 8 experts, top-1: with 3 tokens per rank most experts get none in a step
    (find_unused_parameters needed)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                           num_local_experts=8, num_experts_per_tok=1)
    model = MixtralForCausalLM(config).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    return model


def direct_step(model, batches, find_unused=True, join=False, no_sync=False, static_graph=False):
    """Gradients after DDP steps over ``batches`` (this rank's), ``join``-ed for uneven inputs across ranks;
    ``no_sync``: each batch as two micro-batches, the first under ``ddp.no_sync()``."""
    import contextlib

    device_ids = [DEVICE.index] if DEVICE.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(DEVICE), device_ids=device_ids,
                                                    find_unused_parameters=find_unused, static_graph=static_graph)

    def backward(mine):
        out = ddp(**mine) if isinstance(mine, dict) else ddp(mine)
        (out.loss if hasattr(out, "loss") else out).backward()

    with ddp.join() if join else contextlib.nullcontext():
        for mine in batches:
            if no_sync:
                halves = ([{k: v.chunk(2)[i] for k, v in mine.items()} for i in range(2)] if isinstance(mine, dict)
                          else list(mine.chunk(2)))
                with ddp.no_sync():
                    backward(halves[0])
                backward(halves[1])
            else:
                backward(mine)
    return grads(model)


def direct_batches(recipe, rank, world, uneven):
    """This rank's batches: one share of one batch, or (``uneven``) rank+1 batches of its own."""
    count = rank + 1 if uneven else 1
    g = torch.Generator().manual_seed(100 + rank if uneven else 0)
    found = []
    for _ in range(count):
        if recipe == "blocks":
            x = torch.randn(4 * (1 if uneven else world), 8, generator=g)
            found.append((x if uneven else x.chunk(world)[rank]).to(DEVICE))
        else:
            rows, length = (world, 3) if recipe == "moe" else (BATCH, LENGTH)
            ids = torch.randint(0, 64, (rows if not uneven else 2, length), generator=g)
            if not uneven:
                ids = ids.chunk(world)[rank]
            found.append({"input_ids": ids.to(DEVICE), "labels": ids.clone().to(DEVICE)})
    return found


def direct_case(name, rank, world):
    """``direct:{blocks,remote,moe}[+join][+no_sync][+static_graph]``: DDP(find_unused_parameters=True) with and
    without checkpointing, every trainable gradient compared (and which got none, in both)."""
    variant = name.split(":")[-1].split("+")
    recipe, options = variant[0], set(variant[1:])
    build = {"blocks": Blocks, "remote": remote_code_model, "moe": tiny_mixtral}[recipe]
    batches = direct_batches(recipe, rank, world, "join" in options)
    ddp_options = dict(join="join" in options, no_sync="no_sync" in options, static_graph="static_graph" in options)
    reference = direct_step(build(False), batches, **ddp_options)
    candidate = direct_step(build(True), batches, **ddp_options)
    result = dict(ok=True, trainable=len(reference), **report(reference, candidate))
    result["reference_without_gradient"] = sorted(n for n, g in reference.items() if g is None)
    return result


def advice_case(name, rank, world):
    """DDP's advice to turn find_unused_parameters off (printed by torch once per process, to stderr):
    ``probe:{moe,lora}[+checkpointing]``: two steps with find_unused_parameters=True (run each in a process of its
    own, and read the process's stderr); ``advice:{moe,lora}``: the advice followed (find_unused_parameters=False)
    with reentrant checkpointing, two steps."""
    kind, variant = name.split(":")
    recipe, checkpointing = variant.split("+")[0], variant.endswith("+checkpointing") or kind == "advice"
    model = tiny_mixtral(checkpointing) if recipe == "moe" else build("lora", False, checkpointing)
    batches = direct_batches("moe", rank, world, False) * 2
    direct_step(model, batches, find_unused=kind == "probe")
    return {"ok": True}


def trainer_case(rank, world):
    import tempfile

    from transformers import Trainer, TrainingArguments

    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": ids, "labels": ids.clone()} for ids in torch.randint(0, 64, (12, LENGTH), generator=g)]

    def collate(features):
        return {key: torch.stack([f[key] for f in features]) for key in features[0]}

    def train(checkpointing):
        model = with_lora(tiny_llama())
        model.enable_input_require_grads()  # as PEFT's prepare_model_for_kbit_training does
        args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=2, max_steps=3,
                                 gradient_checkpointing=checkpointing, learning_rate=1e-2, logging_steps=1,
                                 save_strategy="no", report_to="none", remove_unused_columns=False, **TRAINER_DEVICE,
                                 dataloader_num_workers=0, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collate)
        trainer.train()
        wrapper = trainer.model_wrapped
        weights = {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters() if p.requires_grad}
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        return weights, losses, trainer.state.global_step, wrapper

    reference, reference_losses, _, _ = train(False)
    weights, losses, steps, wrapper = train(True)
    found = compare_rule.compare_grads(reference, weights, rtol=RTOL)  # the same rule, on the trained weights
    return {"ok": True, "steps": steps, "losses": losses, "reference_losses": reference_losses,
            "wrapper": type(wrapper).__name__,
            "find_unused_parameters": getattr(wrapper, "find_unused_parameters", None),
            "equal": found.ok, "summary": found.summary(), "lora_weights": len(weights)}


def tiny_tokenizer():
    """A word-level tokenizer over the tiny Llama's 64 ids ("t0" ... "t63"), built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(64)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0", pad_token="t0", eos_token="t1")


def sft_case(rank, world):
    """TRL's SFTTrainer, LoRA through ``peft_config``, its default gradient checkpointing, 3 steps, against
    the same trainer with ``gradient_checkpointing=False`` (TRL on PYTHONPATH: not in the test venv)."""
    import tempfile

    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    g = torch.Generator().manual_seed(1)
    rows = [{"input_ids": ids.tolist()} for ids in torch.randint(2, 64, (12, LENGTH), generator=g)]

    def train(checkpointing):
        torch.manual_seed(1)
        args = SFTConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=2, max_steps=3,
                         gradient_checkpointing=checkpointing, learning_rate=1e-2, logging_steps=1,
                         save_strategy="no", report_to="none", bf16=False, **TRAINER_DEVICE,
                         dataloader_num_workers=0, disable_tqdm=True)
        lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                          init_lora_weights=False)
        trainer = SFTTrainer(model=tiny_llama(), args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tiny_tokenizer(), peft_config=lora)
        trainer.train()
        model = trainer.model
        weights = {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters() if p.requires_grad}
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        return weights, losses, trainer

    reference, reference_losses, _ = train(False)
    weights, losses, trainer = train(True)
    found = compare_rule.compare_grads(reference, weights, rtol=RTOL)
    wrapper = trainer.model_wrapped
    return {"ok": True, "trl": __import__("trl").__version__, "steps": trainer.state.global_step, "losses": losses,
            "reference_losses": reference_losses, "wrapper": type(wrapper).__name__,
            "find_unused_parameters": getattr(wrapper, "find_unused_parameters", None),
            "checkpointing_kwargs": trainer.args.gradient_checkpointing_kwargs,
            "equal": found.ok, "summary": found.summary(), "lora_weights": len(weights)}


def use_unsloth():
    """unsloth-zoo's checkpoint function from the release on PYTHONPATH, as unsloth installs it (CPU)."""
    from hotfix_lab.infra import zoo_loader

    zoo_loader.install_unsloth_swap(zoo_loader.load_release())
    import torch.utils.checkpoint as tuc

    return tuc.CheckpointFunction.__name__


def run_one(case, rank, world, out):
    if case.startswith("unsloth:") and "checkpoint_function" not in out:
        out["checkpoint_function"] = use_unsloth()
    kind = case.split(":", 1)[1] if case.startswith("unsloth:") else case  # unsloth:direct:... too
    if case == "trainer-lora":
        return trainer_case(rank, world)
    if case == "sft-lora":
        return sft_case(rank, world)
    if kind.startswith("direct:"):
        return direct_case(case, rank, world)
    if case.startswith(("advice:", "probe:")):
        return advice_case(case, rank, world)
    return plain_case(case, rank, world)


def main():
    result_dir, cases = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo" if DEVICE.type == "cpu" else "nccl", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank, "world": world, "hotfix_loaded": HOTFIX_LOADED, "device": str(DEVICE),
           "torch": torch.__version__, "transformers": transformers.__version__, "cases": {}}
    rank_results.run_cases(out, cases, lambda case: run_one(case, rank, world, out), compare_rule.short_error,
                           dist.barrier)
    rank_results.write_rank_file(result_dir, out)


if __name__ == "__main__":
    main()
    rank_results.leave()
