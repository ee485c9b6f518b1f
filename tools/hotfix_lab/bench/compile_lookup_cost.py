#!/usr/bin/env python3
"""torch-compile-recompute-graph's cost, as ratios from one run: Dynamo's lookup with its LRU on and off.

    .venv-test/bin/python -P -m hotfix_lab.bench.compile_lookup_cost [--rounds 7] [--calls 20000]

The fix turns Dynamo's LRU off at the first non-reentrant checkpointed call; what that costs is Dynamo's: a frame's
graphs keep the order they were compiled in, so a call served by a later graph is found after the earlier graphs'
guards fail.  Measured on the case where that happens: a function compiled (eager backend) for 3 rows (a static
graph) and then 5 (a dynamic one), called with 5 rows.  Per setting, in one process and interleaved round by round:
µs per call (median over rounds of ``--calls`` calls), the eager function beside it, and the ratio off / on.  The
fix's own question on each later non-reentrant checkpointed call (is it settled: a Python call reading an attribute)
is timed apart.  Run with the fix applied or not: the setting is set here, and put back on at the end.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import timeit
import types

import torch
import torch._dynamo


def _function(x):
    return x * 2 + 1


def _per_call(function, x, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        function(x)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args()
    torch.set_num_threads(1)
    switch = torch._C._dynamo.eval_frame._set_lru_cache
    compiled = {}
    torch._dynamo.reset()
    for lru in (True, False):  # per setting a code object of its own (Dynamo's graphs hang on it): static, dynamic
        switch(lru)
        own = types.FunctionType(_function.__code__.replace(), _function.__globals__, f"_function_lru_{lru}")
        function = torch.compile(own, backend="eager")
        function(torch.randn(3, 4))
        function(torch.randn(5, 4))
        compiled[lru] = function
    x = torch.randn(5, 4)
    times = {"eager": [], True: [], False: []}
    for _ in range(args.rounds):
        times["eager"].append(_per_call(_function, x, args.calls))
        for lru in (True, False):
            switch(lru)
            times[lru].append(_per_call(compiled[lru], x, args.calls))
    switch(True)
    on, off, eager = (statistics.median(times[key]) for key in (True, False, "eager"))
    from hotfix.patches.torch_compile_recompute_graph import patch

    idle = patch._keep_graph_order().idle
    question = min(timeit.repeat(lambda: idle(None, (), {}), number=100000, repeat=args.rounds)) / 100000 * 1e6
    empty = min(timeit.repeat(lambda: None, number=100000, repeat=args.rounds)) / 100000 * 1e6
    result = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
              "eager_us": round(eager, 2), "lru_on_us": round(on, 2), "lru_off_us": round(off, 2),
              "off_over_on": round(off / on, 3), "settled_question_us": round(question - empty, 3)}
    print(f"a call served by a frame's second graph: LRU on {on:.2f} µs, off {off:.2f} µs (ratio {off / on:.3f}; "
          f"the eager function {eager:.2f} µs); the fix's question once settled: {question - empty:.3f} µs a call")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
