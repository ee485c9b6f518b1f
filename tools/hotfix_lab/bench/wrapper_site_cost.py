#!/usr/bin/env python3
"""The wrapper call site's own cost: transformers layers under torch's ``checkpoint_wrapper`` (issue 52, part 1).

    .venv-test/bin/python -P -m hotfix_lab.bench.wrapper_site_cost [--layers 24] [--rounds 7]

FSDP / FSDP2 recipes (accelerate, Lightning, torchtitan) wrap each layer in torch's ``CheckpointWrapper``
(``apply_activation_checkpointing``); torch-checkpoint-wrapper hands each call to the layer's own checkpointing, with
the wrapper's checkpoint function, so that transformers' fixes act on it.  The layers are hotfix_lab.bench.wrapper_cost's
case (a) (Llama-style ``cos``/``sin`` by keyword, nothing to lift), ``--layers`` of them in a ``PreTrainedModel`` whose
checkpointing transformers never enabled, every one wrapped, ``CheckpointImpl.REENTRANT`` and ``NO_REENTRANT``.  Per
call: the forward of the whole tiny model (width 8, 4 tokens: the wrapper's microseconds are not lost in the layers'
compute) divided by its layers, with hotfix active minus the same after ``hotfix.revert()``, interleaved over
``--rounds`` rounds of ``--calls`` forwards (medians).  Every layer's call in turn, as in training: a cost that grows
with the model's layers shows as a larger figure at a larger ``--layers``.
Goal (issue 52): <= 20 µs per call.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import time

import torch

import hotfix
from hotfix_lab.bench import wrapper_cost  # ( the layers of its case (a))


def _model(layers: int, width: int, impl: str):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl,
                                                                             apply_activation_checkpointing,
                                                                             checkpoint_wrapper)
    from transformers import PretrainedConfig, PreTrainedModel

    Layer = wrapper_cost._layers()

    class SiteConfig(PretrainedConfig):
        model_type = "hotfix-wrapper-site-bench"

    class Model(PreTrainedModel):
        config_class = SiteConfig

        def __init__(self):
            super().__init__(SiteConfig())
            self.layers = torch.nn.ModuleList(Layer(width, "a", i) for i in range(layers))

        def forward(self, hidden):
            keywords = {"cos": torch.ones_like(hidden[0]), "sin": torch.zeros_like(hidden[0])}
            for layer in self.layers:
                hidden = layer(hidden, **keywords)
            return hidden

    model = Model().train()
    wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=getattr(CheckpointImpl, impl))
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, Layer))
    return model


def _per_call_us(model, hidden, calls: int, layers: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        model(hidden)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6 / layers


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=100, help="model forwards timed per round")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    hidden = torch.randn(1, 4, 8, requires_grad=True)
    results = {}
    for impl in ("REENTRANT", "NO_REENTRANT"):
        torch.manual_seed(0)
        model = _model(args.layers, 8, impl)
        per_call = {"with": [], "without": []}
        for _ in range(args.rounds):
            for side in ("without", "with"):
                hotfix.revert() if side == "without" else hotfix.activate()
                per_call[side].append(_per_call_us(model, hidden, args.calls, args.layers))
        hotfix.activate()
        with_us, without_us = statistics.median(per_call["with"]), statistics.median(per_call["without"])
        results[impl] = {"call_us_with": round(with_us, 1), "call_us_without": round(without_us, 1),
                         "hotfix_us_per_call": round(with_us - without_us, 1)}
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
                      f"{torch.get_num_threads()} torch thread(s)", "python": platform.python_version(),
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "hotfix": hotfix.__version__, "settings": vars(args), "cases": results}, indent=1))
    for impl, result in results.items():
        print(f"checkpoint_wrapper {impl}, {args.layers} layers: {result['hotfix_us_per_call']} µs per call "
              f"(goal <= 20)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
