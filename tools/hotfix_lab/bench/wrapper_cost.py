#!/usr/bin/env python3
"""The wrapper's own cost: one checkpointed GradientCheckpointingLayer call with hotfix vs without (issue 26).

    .venv-test/bin/python -P -m hotfix_lab.bench.wrapper_cost [--layers 24] [--rounds 7]

Three layers, each a transformers ``GradientCheckpointingLayer`` subclass called as models call them
(hidden states positionally, the rest by keyword), reentrant checkpointing, training:
  (a) Llama-style: ``cos``/``sin`` by keyword, no grad: nothing to lift (the common case);
  (b) a keyword tensor that needs grad (Whisper's ``encoder_hidden_states``): lifted into the inputs;
  (c) a shared mapping handed by keyword, one layer storing keys that later layers read (Gemma-4 KV
      sharing): the layer gets a private copy, the stored tensors become checkpoint outputs.
The model is a ``PreTrainedModel`` and checkpointing is switched on with ``gradient_checkpointing_enable``,
as in training scripts, so every slot hotfix puts on a checkpointing class (both transformers fixes)
is in the measured call.  Per case, in one process and interleaved round by round: the forward of
one checkpointed call of a tiny such layer (µs, median over ``--calls`` calls, median over rounds; hotfix minus without = the
wrapper's cost), and a whole training step (forward + backward) of a model of ``--layers`` layers of
``--width``, as a ratio with / without hotfix.  "Without" is the
same process after ``hotfix.revert()`` (every original object back), "with" after ``hotfix.activate()``.
Where upstream's reentrant step cannot train the layer at all (it crashes: the bug), the step ratio is
against non-reentrant checkpointing, and says so.  ``--routing``: hotfix's side as in a process where
moe-routing-replay has found a router (each checkpointed call then enters a region).
Goal (a): <= 20 µs per call and <= 1 % of the step.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import statistics
import time

import torch

import hotfix


def _layers():
    from transformers.modeling_layers import GradientCheckpointingLayer

    class Layer(GradientCheckpointingLayer):
        def __init__(self, width, case, index):
            super().__init__()
            self.case, self.index = case, index
            self.q, self.k, self.o = (torch.nn.Linear(width, width) for _ in range(3))

        def forward(self, hidden, cos=None, sin=None, encoder_hidden_states=None, shared=None):
            keys = self.k(hidden)
            if self.case == "a":
                keys = keys * cos + keys * sin
            elif self.case == "b":
                keys = keys + encoder_hidden_states
            elif self.index % 2:  # (c): odd layers read what the even layer before stored
                keys = shared["keys"]
            else:
                shared["keys"] = keys
            scores = torch.softmax(self.q(hidden) @ keys.transpose(-1, -2) / keys.shape[-1] ** 0.5, dim=-1)
            return hidden + self.o(scores @ hidden)

    return Layer


def _model_class():
    from transformers import PretrainedConfig, PreTrainedModel

    class BenchConfig(PretrainedConfig):
        model_type = "hotfix-wrapper-bench"

    class Model(PreTrainedModel):
        config_class = BenchConfig
        supports_gradient_checkpointing = True

        def __init__(self, case, layers, width, reentrant=True):
            super().__init__(BenchConfig())
            Layer = _layers()
            self.case = case
            self.layers = torch.nn.ModuleList(Layer(width, case, i) for i in range(layers))
            self.encoder = torch.nn.Linear(width, width)
            # transformers' own enabler: it stores the checkpoint function on every layer, and hotfix's
            # coverage puts its slots on the classes that received it
            self.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})

        def keywords(self, hidden):
            if self.case == "a":
                return {"cos": torch.ones_like(hidden[0]), "sin": torch.zeros_like(hidden[0])}
            if self.case == "b":
                return {"encoder_hidden_states": self.encoder(hidden)}
            return {"shared": collections.UserDict()}

        def forward(self, hidden):
            keywords = self.keywords(hidden)
            for layer in self.layers:
                hidden = layer(hidden, **keywords)
            return hidden.pow(2).mean()

    return Model


def _call_us(model, hidden, calls=200):
    """Median µs of one checkpointed layer call's forward (the layer that does the case's work)."""
    layer, keywords = model.layers[0], model.keywords(hidden)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        layer(hidden, **keywords)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _step_s(model, hidden, steps=3):
    times = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(hidden).backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=500, help="checkpointed calls timed per round (per-call cost)")
    p.add_argument("--routing", action="store_true",
                   help="as in a process where moe-routing-replay found a router: every checkpointed call a region")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    hidden = torch.randn(args.batch, args.tokens, args.width, requires_grad=True)
    # The per-call cost is timed on a tiny layer (width 8, 4 tokens): its own compute is small enough
    # that the wrapper's microseconds are not lost in the noise of a busy machine.
    tiny = torch.randn(1, 4, 8, requires_grad=True)
    Model = _model_class()
    results = {}
    for case in "abc":
        torch.manual_seed(0)
        model = Model(case, args.layers, args.width).train()
        probe = Model(case, 2, 8).train()
        baseline = Model(case, args.layers, args.width, reentrant=False).train()
        baseline.load_state_dict(model.state_dict())
        upstream_runs = True
        calls = {"with": [], "without": []}
        steps = {"with": [], "without": []}
        for _ in range(args.rounds):  # interleaved: drift of a busy machine hits both sides alike
            for side in ("without", "with"):
                hotfix.revert() if side == "without" else hotfix.activate()
                if side == "with" and args.routing:  # what reading an MoE's classes switches on (the region per call)
                    hotfix.known_patches()["moe-routing-replay"].routing = True
                calls[side].append(_call_us(probe, tiny, args.calls))
                if side == "without" and upstream_runs:
                    try:
                        steps[side].append(_step_s(model, hidden))
                        continue
                    except RuntimeError:  # the bug itself: upstream's reentrant step cannot train this layer
                        upstream_runs = False
                        steps[side] = []
                steps[side].append(_step_s(baseline if side == "without" else model, hidden))
        hotfix.activate()
        from hotfix.checkpointing.slot import slots_on

        slots = [f"{slot.wrapper.__module__}.{slot.wrapper.__name__}" for slot in slots_on(type(probe.layers[0]))]
        with_us, without_us = statistics.median(calls["with"]), statistics.median(calls["without"])
        step_with, step_without = statistics.median(steps["with"]), statistics.median(steps["without"])
        results[case] = {
            "call_us_with": round(with_us, 1), "call_us_without": round(without_us, 1),
            "wrapper_us_per_call": round(with_us - without_us, 1),
            "step_s_with": round(step_with, 4), "step_s_without": round(step_without, 4),
            "step_ratio": round(step_with / step_without, 4),
            "step_without_is": "reentrant, hotfix reverted" if upstream_runs else
            "non-reentrant, hotfix reverted (upstream's reentrant step crashes: the bug)",
            "wrappers_in_the_call": slots,  # every hotfix slot a checkpointed call of this layer goes through
        }
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
                      f"{torch.get_num_threads()} torch thread(s)", "python": platform.python_version(),
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "hotfix": hotfix.__version__, "settings": vars(args), "cases": results}, indent=1))
    a = results["a"]
    print(f"(a) nothing to lift: {a['wrapper_us_per_call']} µs per call (goal <= 20), step ratio {a['step_ratio']} "
          f"(goal <= 1.01)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
