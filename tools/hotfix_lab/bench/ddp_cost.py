#!/usr/bin/env python3
"""transformers-ddp-find-unused's cost: DDP(find_unused_parameters=True), reentrant checkpointing, LoRA.

    .venv-test/bin/python -P -m hotfix_lab.bench.ddp_cost [--layers 8] [--width 256] [--rounds 7]

One gloo rank (world size 1, loopback) in this process: DDP's unused-parameter search and its
"ready" marks run as with more ranks, the all-reduce has no peer to wait for, so the figures are
the fix's own cost, not the network's.  A Llama-style model (tools/hotfix_lab/cases/ddp_cases.py's, at
``--width`` / ``--layers``) with PEFT LoRA (r 8) on q_proj/v_proj, interleaved round by round:

* per checkpointed call, the fix's own work, timed alone on one of the model's decoder layers
  (the work grows with a layer's modules and trainable parameters, not with the tokens): in the
  forward, inside a searching DDP module's forward context (``_inside_ddp_forward``, what DDP's
  forward opens), the slot wrapper with a checkpoint stand-in that returns at once (finding the
  layer, its trainable parameters as inputs); in the recomputation, putting the detached copies in
  the parameters' places and back around a layer call that returns at once.  Upstream does
  neither (and crashes);
* torch-ddp-find-unused's own work per call of torch's reentrant checkpoint entered directly
  (``CheckpointFunction.apply`` with the same layer, a stand-in that returns at once): inside a
  searching DDP forward, and outside any (what every reentrant call of a process with hotfix pays);
  each also as a share of the step time per checkpointed layer (a ratio from the same run);
* a training step (forward + backward) through ``DistributedDataParallel``: reentrant with hotfix
  (upstream's crashes: "Expected to mark a variable ready only once") against non-reentrant
  checkpointing (what upstream recommends instead; the fix leaves it alone) and no checkpointing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import hotfix
from hotfix_lab.cases import ddp_cases
from hotfix_lab.infra import rank_results


def _model(width, layers, checkpointing):
    model = ddp_cases.with_lora(ddp_cases.tiny_llama(vocab_size=256, hidden_size=width, intermediate_size=2 * width,
                                                     num_hidden_layers=layers, num_attention_heads=4,
                                                     num_key_value_heads=4, max_position_embeddings=512), rank=8)
    model.enable_input_require_grads()
    if checkpointing is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing})
    return model


def _fix_us(ddp, calls):
    """Median µs of the fix's work per checkpointed call of one decoder layer: (forward side, recomputation side)."""
    import functools

    from hotfix.checkpointing.ddp import trainable_slots, with_parameters_as_inputs
    from hotfix.patches.transformers_ddp_find_unused import checkpoint_with_visible_parameters, patch

    layer = ddp.module.get_base_model().model.layers[0]
    hidden = torch.randn(1, 4, layer.self_attn.q_proj.in_features, requires_grad=True)
    function = functools.partial(layer.__call__, position_embeddings=None)  # as 4.53-4.57 pass it: never called
    wrapper = checkpoint_with_visible_parameters(patch)
    returns_at_once = lambda run, *inputs, **kwargs: run  # noqa: E731  (the checkpoint stand-in)
    forward = []
    with ddp._inside_ddp_forward():  # DDP's own forward context: the fix sees a searching DDP module
        for _ in range(calls):
            start = time.perf_counter()
            wrapper(returns_at_once, None, (function, hidden), {"use_reentrant": True})
            forward.append(time.perf_counter() - start)
    # torch-ddp-find-unused: the same layer's call entered directly (torch's checkpoint calling
    # CheckpointFunction.apply(layer, preserve, hidden)), inside DDP's forward and, what every reentrant call of the
    # process now pays, outside it
    from hotfix.patches.torch_ddp_find_unused import apply_with_visible_parameters, patch as direct_patch

    direct = apply_with_visible_parameters(direct_patch)
    direct_forward, direct_outside = [], []
    with ddp._inside_ddp_forward():
        for _ in range(calls):
            start = time.perf_counter()
            direct(returns_at_once, None, (layer, True, hidden), {})
            direct_forward.append(time.perf_counter() - start)
    for _ in range(calls):
        start = time.perf_counter()
        direct(returns_at_once, None, (layer, True, hidden), {})
        direct_outside.append(time.perf_counter() - start)
    slots = trainable_slots([layer])
    parameters = tuple({id(p): p for _, _, p in slots}.values())
    twins = tuple(p.detach().requires_grad_() for p in parameters)
    run = with_parameters_as_inputs(lambda *inputs: None, 1, slots, parameters, lambda: None)
    recompute = []
    for _ in range(calls):
        start = time.perf_counter()
        run(hidden, *twins)
        recompute.append(time.perf_counter() - start)
    return (statistics.median(forward) * 1e6, statistics.median(recompute) * 1e6, len(parameters),
            statistics.median(direct_forward) * 1e6, statistics.median(direct_outside) * 1e6)


def _step_s(ddp, batch, steps):
    times = []
    for _ in range(steps):
        ddp.module.zero_grad(set_to_none=True)
        start = time.perf_counter()
        ddp(**batch).loss.backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=3, help="training steps timed per variant per round")
    p.add_argument("--calls", type=int, default=200, help="probe forwards timed per round (per-call cost)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{rank_results.free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=120))
    ddp = lambda model: torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)  # noqa: E731
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (args.batch, args.tokens), generator=g)
    batch = {"input_ids": ids, "labels": ids}
    variants = {"reentrant + hotfix": True, "non-reentrant": False, "no checkpointing": None}
    models = {name: ddp(_model(args.width, args.layers, reentrant)) for name, reentrant in variants.items()}
    calls = {"forward": [], "recomputation": []}
    direct_calls = {"direct call, inside DDP's forward": [], "direct call, outside DDP": []}
    steps = {name: [] for name in variants}
    for _ in range(args.rounds):  # interleaved: drift of a busy machine hits every variant alike
        forward_us, recompute_us, trainable, direct_us, outside_us = _fix_us(models["reentrant + hotfix"], args.calls)
        calls["forward"].append(forward_us)
        calls["recomputation"].append(recompute_us)
        direct_calls["direct call, inside DDP's forward"].append(direct_us)
        direct_calls["direct call, outside DDP"].append(outside_us)
        for name, model in models.items():
            steps[name].append(_step_s(model, batch, args.steps))
    dist.destroy_process_group()
    per_call = {side: round(statistics.median(times), 1) for side, times in calls.items()}
    step = {name: statistics.median(times) for name, times in steps.items()}
    result = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch thread(s)", "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "peft": __import__("peft").__version__, "hotfix": hotfix.__version__,
        "settings": vars(args),
        "trainable_parameters_per_layer": trainable,
        "fix_us_per_checkpointed_call": dict(per_call, total=round(sum(per_call.values()), 1)),
        "torch_ddp_find_unused_us_per_call": {side: round(statistics.median(t), 2) for side, t in direct_calls.items()},
        "layer_step_s_per_checkpointed_layer": round(step["reentrant + hotfix"] / args.layers, 5),
        "step_s": {name: round(value, 4) for name, value in step.items()},
        "step_ratio_vs_non_reentrant": round(step["reentrant + hotfix"] / step["non-reentrant"], 3),
        "step_ratio_vs_no_checkpointing": round(step["reentrant + hotfix"] / step["no checkpointing"], 3),
    }
    print(json.dumps(result, indent=1))
    print(f"DDP(find_unused_parameters=True), LoRA, {args.layers} layers x {args.width}: "
          f"{result['fix_us_per_checkpointed_call']['total']} µs per checkpointed call (forward "
          f"{per_call['forward']}, recomputation {per_call['recomputation']}); step reentrant + hotfix / "
          f"non-reentrant = {result['step_ratio_vs_non_reentrant']}, / no checkpointing = "
          f"{result['step_ratio_vs_no_checkpointing']}")
    inside, outside = result["torch_ddp_find_unused_us_per_call"].values()
    per_layer_us = result["layer_step_s_per_checkpointed_layer"] * 1e6
    print(f"torch-ddp-find-unused per direct call: {inside} µs inside DDP's forward, {outside} µs outside DDP; "
          f"against a step's share per checkpointed layer ({per_layer_us:.0f} µs): {inside / per_layer_us:.4f} and "
          f"{outside / per_layer_us:.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
