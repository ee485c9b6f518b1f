"""Mixtures of experts under checkpointing, with the drift a GPU makes, on CPU; one JSON line per case.

    python -m moe_cases [--device cuda --dtype bfloat16] CASE [CASE ...]
                                            (tools/hotfix_lab on PYTHONPATH; a CASE is MODEL:MODE[:lora][:nodrift])
    python -m moe_cases --types             (the MoE model types of this transformers, from its modeling code)

A GPU's recomputation reads the router's scores a few last bits apart from the forward's; where experts nearly tie,
it picks another.  The drift device (:class:`Drift`) makes that happen on CPU, every time: the router's rows tie
exactly in groups of ``top_k + 1`` experts (so each token's k-th and (k+1)-th choices tie), and during a
recomputation only (code running inside autograd's backward) each group's rows are scaled by ``1 +- 1e-6``: the
recomputation breaks every tie its own way, the forward broke them by ``topk``'s index order.  Without
checkpointing nothing runs in the backward: the reference step sees the ties as the forward does.

Each case: one step without checkpointing, one with it (``MODE``: reentrant / non-reentrant, through transformers'
enabler), same seed and batch; every trainable gradient compared at ``RTOL`` relative (a gradient missing on one
side is never equal).  ``lora``: peft LoRA on q, v and the router (an ``nn.Linear`` router as a module, 5.x's bare
router weight through peft's ``target_parameters``; its base weight tied and drifted; the adapter's B starts at zero,
so the ties hold).  ``nodrift``: no tie, no drift; the checkpointed step's gradients as a digest (with hotfix
bit-identical to without: the replay changes nothing where nothing drifts).  This module imports torch,
transformers, peft, never hotfix: a child that
must run upstream imports it before anything activates hotfix.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn

from hotfix_lab.infra import standalone

#: relative tolerance against the step without checkpointing (the drift itself is 1e-6 relative)
RTOL = 1e-4
#: the seed each step starts from: a router that samples (PhiMoE's Gumbel draws) draws alike in both steps
STEP_SEED = 1234
#: the drift's size: a few last bits of float32
EPSILON = 1e-6
#: transformers model type -> (config class, model class, config fields); tiny, random weights, 2 layers
MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1,
                       norm_topk_prob=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=8, num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(num_local_experts=8, num_experts_per_tok=2, head_dim=8, sliding_window=8,
                     layer_types=["sliding_attention", "full_attention"])),
}
COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.0)


def in_backward() -> bool:
    """Is this code running inside autograd's backward (a checkpoint's recomputation)?"""
    return torch._C._current_graph_task_id() != -1


class Drift(nn.Module):
    """A parametrization of a router weight: each row scaled by one, and during a recomputation by ``scale``
    (the same operation either way: what autograd saves keeps its shapes; a scale of one is exact)."""

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("one", torch.ones_like(scale), persistent=False)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * (self.scale if in_backward() else self.one)


def router_weights(model, num_experts: int):
    """Every router: a module whose 2-D weight has a row per expert, on a path through a gate / router (Qwen's
    ``mlp.gate``, Hunyuan's ``gate.wg``, Granite's ``router.layer``, LoRA's ``gate.base_layer``), not an expert's."""
    found = []
    for name, module in model.named_modules():
        weight = module.__dict__.get("_parameters", {}).get("weight")
        parts = set(name.split("."))
        through_router = any(part in ("gate", "router") or part.endswith(("_gate", "_router")) for part in parts)
        if through_router and "experts" not in parts and weight is not None and weight.dim() == 2 \
                and weight.shape[0] == num_experts:
            found.append(module)
    return found


def tie_and_drift(model, num_experts: int, top_k: int, epsilon: float = EPSILON) -> int:
    """Tie each router's rows in groups of ``top_k + 1`` and put the drift on them; returns how many routers."""
    from torch.nn.utils import parametrize

    group = top_k + 1
    routers = router_weights(model, num_experts)
    for module in routers:
        with torch.no_grad():
            for start in range(0, num_experts, group):
                module.weight[start:start + group] = module.weight[start].clone()
            bias = getattr(module, "bias", None)
            if isinstance(bias, torch.Tensor):
                for start in range(0, num_experts, group):
                    bias[start:start + group] = bias[start].clone()
        scale = torch.ones(num_experts, 1)
        for start in range(0, num_experts, group):
            members = list(range(start, min(start + group, num_experts)))
            if len(members) > top_k:  # a group the forward must split: its first and last members move apart
                scale[members[0]] = 1 - epsilon
                scale[members[-1]] = 1 + epsilon
        parametrize.register_parametrization(module, "weight", Drift(scale))
    return len(routers)


#: a tiny size for every field a MoE config may have (set where the model type's config has the field)
TINY = dict(COMMON, num_key_value_heads=4, head_dim=8, moe_intermediate_size=16, shared_expert_intermediate_size=16,
            num_experts=8, num_local_experts=8, n_routed_experts=8, moe_num_experts=8, num_experts_per_tok=2,
            moe_topk=2, n_group=1, topk_group=1, first_k_dense_replace=0, decoder_sparse_step=1, mlp_only_layers=[],
            n_shared_experts=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
            sliding_window=8, hidden_dropout=0.0, router_jitter_noise=0.0, layer_types=None, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K = ("num_experts_per_tok", "moe_topk")


def tiny_config(model_type: str):
    """``(config, causal LM class)`` for any model type: its defaults, every :data:`TINY` field it has set small."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type in MODELS:
        config_name, model_name, fields = MODELS[model_type]
        return getattr(transformers, config_name)(**COMMON, **fields), getattr(transformers, model_name)
    defaults = transformers.AutoConfig.for_model(model_type)
    fields = {key: value for key, value in TINY.items() if hasattr(defaults, key)}
    if fields.get("layer_types", 0) is None:
        fields.pop("layer_types")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    return config, getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


def moe_types() -> list:
    """The model types of this transformers with a causal LM whose modeling code calls ``topk`` and whose config
    counts experts: read from the release's files (nothing imported but the auto mappings), sorted."""
    import os

    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    models = os.path.join(os.path.dirname(transformers.__file__), "models")
    found = []
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        folder = model_type_to_module_name(model_type)
        try:
            with open(os.path.join(models, folder, f"modeling_{folder}.py")) as handle:
                modeling = handle.read()
            with open(os.path.join(models, folder, f"configuration_{folder}.py")) as handle:
                configuration = handle.read()
        except OSError:
            continue
        if "topk" in modeling and any(name in configuration for name in EXPERTS):
            found.append(model_type)
    return sorted(found)


#: a tiny model has under this many parameters; a config whose defaults the tiny fields do not reach (a multimodal
#: wrapper's nested text config) is refused before it is built (gemma4's defaults: 22 GB)
MAX_PARAMETERS = 20_000_000


def build(model_type: str, lora: bool = False, seed: int = 0, drift: bool = True, epsilon: float = EPSILON):
    config, model_class = tiny_config(model_type)
    with torch.device("meta"):
        size = sum(parameter.numel() for parameter in model_class(config).parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"not tiny: {size:,} parameters at these fields")
    torch.manual_seed(seed)
    model = model_class(config).train()
    num_experts = next(getattr(config, name) for name in EXPERTS if isinstance(getattr(config, name, None), int))
    top_k = next(getattr(config, name) for name in TOP_K if isinstance(getattr(config, name, None), int))
    if lora:
        from peft import LoraConfig, get_peft_model

        routers = {name.rsplit(".", 1)[-1]: module for name, module in model.named_modules()
                   if name.rsplit(".", 1)[-1] in ("gate", "router")}
        linear = sorted(leaf for leaf, module in routers.items() if isinstance(module, nn.Linear))
        # a router that is no nn.Linear (5.x's TopKRouter: a bare weight): LoRA on that parameter (peft's
        # target_parameters, a ParamWrapper around the router)
        parameters = sorted(f"{leaf}.weight" for leaf, module in routers.items()
                            if not isinstance(module, nn.Linear) and isinstance(getattr(module, "weight", None),
                                                                                  nn.Parameter))
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"] + linear, lora_dropout=0.0,
                            **({"target_parameters": parameters} if parameters else {}))
        model = get_peft_model(model, config)
        model.train()
    routers = tie_and_drift(model, num_experts, top_k, epsilon) if drift else len(router_weights(model, num_experts))
    generator = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, 64, (2, 12), generator=generator)
    # use_cache off, as trainers set it (5.x linear-attention hybrids refuse a cache in training)
    return model, {"input_ids": ids, "labels": ids.clone(), "use_cache": False}, routers


def enable(model, reentrant: bool) -> None:
    kwargs = {"use_reentrant": reentrant}
    for name in ("activation_checkpointing_enable", "gradient_checkpointing_enable"):
        method = getattr(model, name, None)
        if method is not None:
            activation = name.startswith("activation")
            method(**{"activation_checkpointing_kwargs" if activation else "gradient_checkpointing_kwargs": kwargs})
            return


def run(case: str, device: str = "cpu", dtype: str = "float32") -> dict:
    import transformers

    compare = standalone.load("compare")
    model_type, mode, *extra = case.split(":")
    result = {"case": case, "transformers": transformers.__version__, "device": device, "dtype": dtype}
    try:
        # the drift: a few last bits of the dtype the model trains in (bf16's last bit is float32's 2**16)
        epsilon = max(EPSILON, torch.finfo(getattr(torch, dtype)).eps)
        model, batch, routers = build(model_type, lora="lora" in extra, drift="nodrift" not in extra, epsilon=epsilon)
        model.to(device=device, dtype=getattr(torch, dtype))
        batch = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}
    except Exception as exc:  # a model type this tiny builder cannot make
        return dict(result, status="n/a", error=f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
    result["routers"] = routers
    if not routers:
        return dict(result, status="n/a", error="no router weight found (a gate / router with a row per expert)")
    model.zero_grad(set_to_none=True)
    try:
        torch.manual_seed(STEP_SEED)  # each step draws the same random numbers (PhiMoE samples its experts)
        reference_loss = model(**batch).loss
        reference_loss.backward()
    except Exception as exc:  # the model does not train on CPU here (a kernel it needs): nothing to compare
        return dict(result, status="n/a", error=f"no reference step: {type(exc).__name__}: {exc}".splitlines()[0][:200])
    reference = compare.collect_grads(model)
    try:
        enable(model, reentrant=mode == "reentrant")
    except Exception as exc:  # the model type refuses checkpointing ("does not support activation checkpointing")
        return dict(result, status="n/a", error=f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
    model.zero_grad(set_to_none=True)
    try:
        torch.manual_seed(STEP_SEED)
        loss = model(**batch).loss
        loss.backward()
    except Exception as exc:
        return dict(result, status="crash", error=f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
    grads = compare.collect_grads(model)
    report = compare.compare_grads(reference, grads, rtol=RTOL if dtype == "float32" else compare.tolerance_for(dtype))
    if "nodrift" in extra:  # the checkpointed step's gradients, bit for bit (with hotfix and without alike)
        result["digest"] = digest(float(loss), grads)
    return dict(result, status="equal" if report.ok else "differs", summary=report.summary(),
                total=len(reference), missing=len(report.missing), unexpected=len(report.unexpected),
                wrong=len(report.wrong), loss_equal=float(loss) == float(reference_loss))


def digest(loss: float, grads: dict) -> str:
    import hashlib

    hashed = hashlib.sha256(repr(loss).encode())
    for name in sorted(grads):
        grad = grads[name]
        raw = b"none" if grad is None else grad.cpu().contiguous().view(torch.uint8).numpy().tobytes()  # any dtype
        hashed.update(name.encode() + raw)
    return hashed.hexdigest()[:16]


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", action="store_true", help="print this transformers' MoE model types")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="float32 (1e-4 relative) or bfloat16 (its tolerance)")
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args(argv)
    if args.types:
        print(json.dumps(moe_types()))
        return 0
    for case in args.cases:
        print(json.dumps(run(case, args.device, args.dtype)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
