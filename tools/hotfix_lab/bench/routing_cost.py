#!/usr/bin/env python3
"""moe-routing-replay's costs, as ratios from one run: a checkpointed MoE training step with the replay and without.

    .venv-test/bin/python -P -m hotfix_lab.bench.routing_cost [--rounds 7] [--steps 5] [--tokens 256]

A tiny Qwen3-MoE of the test venv's transformers (hotfix_lab.cases.moe_cases, no drift: the replay changes nothing,
only its cost shows), reentrant and non-reentrant checkpointing through transformers' enabler.  Per mode, in one
process and interleaved round by round: a training step (forward + backward, median of ``--steps``) with hotfix as
installed, and the same after ``hotfix.revert()`` (upstream), as a ratio; the bytes the recorded routing holds per
MoE layer per step (the forward's indices: tokens x top_k int64, counted from the regions the step made); the
replay's own cost per checkpointed call (µs: torch's reentrant checkpoint of a function that does nothing, hotfix
active, with a router routed in the process and without: the region each call then enters).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from hotfix_lab.cases import moe_cases


def _step(model, batch) -> float:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    model(**batch).loss.backward()
    return time.perf_counter() - start


def _region_call_us(fix, calls: int = 20000) -> float:
    from torch.utils.checkpoint import checkpoint

    x = torch.zeros(1, requires_grad=True)
    function = lambda t: t  # noqa: E731
    start = time.perf_counter()
    for _ in range(calls):
        checkpoint(function, x, use_reentrant=True)
    return (time.perf_counter() - start) / calls * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import hotfix
    import transformers
    from hotfix.checkpointing import region

    fix = hotfix.known_patches()["moe-routing-replay"]
    made = []
    original_init = region.Region.__init__

    def counting_init(self):  # the bench counts the regions a step makes (the product keeps none)
        original_init(self)
        made.append(self)

    region.Region.__init__ = counting_init
    results = {}
    for mode in ("reentrant", "non-reentrant"):
        model, batch, _ = moe_cases.build("qwen3_moe", drift=False)
        batch = {**batch, "input_ids": torch.randint(0, 64, (1, args.tokens)), "labels": None}
        batch["labels"] = batch["input_ids"].clone()
        moe_cases.enable(model, reentrant=mode == "reentrant")
        times = {"with": [], "without": []}
        for _ in range(args.rounds):
            for side in ("without", "with"):
                if side == "without":
                    hotfix.revert()
                else:
                    hotfix.activate()
                    fix.route(model)
                _step(model, batch)  # warm
                times[side].append(statistics.median(_step(model, batch) for _ in range(args.steps)))
        made.clear()
        _step(model, batch)
        layers = sum(1 for m in model.modules() if type(m).__name__.endswith("SparseMoeBlock"))
        recorded = sum(indices.numel() * indices.element_size() for r in made for indices in r.records)
        regions_made = len(made)
        with_s, without_s = statistics.median(times["with"]), statistics.median(times["without"])
        results[mode] = {"step_ms_without": round(without_s * 1e3, 2), "step_ms_with": round(with_s * 1e3, 2),
                         "ratio": round(with_s / without_s, 4), "regions_per_step": regions_made,
                         "recorded_bytes_per_moe_layer_per_step": recorded // max(layers, 1),
                         "tokens": args.tokens, "top_k": model.config.num_experts_per_tok}
    per_call = {"without": [], "with": []}
    hotfix.activate()
    for _ in range(args.rounds):  # hotfix active both times: only the region differs
        for side in ("without", "with"):
            fix.routing = side == "with"
            per_call[side].append(_region_call_us(fix))
    per_call = {side: statistics.median(values) for side, values in per_call.items()}
    region.Region.__init__ = original_init
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
                      "cpus": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
                      "steps": results,
                      "region_us_per_call": {"without": round(per_call["without"], 2),
                                             "with": round(per_call["with"], 2),
                                             "cost": round(per_call["with"] - per_call["without"], 2)}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
