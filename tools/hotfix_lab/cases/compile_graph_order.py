"""Which compiled graph each run of a checkpointed call runs (pytorch/pytorch#166926); one JSON line.

    python -P -m hotfix_lab.cases.compile_graph_order

A function compiled with a backend that numbers its graphs and records which one runs, called in two non-reentrant
checkpointed calls with 3 and then 5 rows (Dynamo compiles a static graph, then a dynamic one), then one backward.
``runs``: the graphs run in order: the forward of each call, then the recomputations (the second call's first);
``recomputation_runs_forwards_graph``: the first call's recomputation ran the graph its forward ran.  Run twice in
one process: as installed (imports torch only: hotfix, installed, activates at the first non-reentrant checkpoint
call), then after ``hotfix.revert()`` where hotfix is active (``upstream``).  ``hotfix_before``: hotfix loaded before
the first case; ``applied``: torch-compile-recompute-graph applied after it.  No numerics involved: any torch
line, any machine.  tests/unit/test_torch_compile_recompute_graph.py (torch 2.13) and
tests/versions/test_torch_lines.py (the side torch lines) run it.
"""

from __future__ import annotations

import json
import sys


def graphs_run() -> list:
    import torch
    import torch._dynamo
    from torch.utils.checkpoint import checkpoint

    graphs, runs = [], []

    def numbering(graph_module, example_inputs):
        number = len(graphs)
        graphs.append(graph_module)

        def run(*args):
            runs.append(number)
            return graph_module.forward(*args)

        return run

    torch._dynamo.reset()
    compiled = torch.compile(lambda x: torch.sin(x) * 2, backend=numbering)
    first, second = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    (checkpoint(compiled, first, use_reentrant=False).sum()
     + checkpoint(compiled, second, use_reentrant=False).sum()).backward()
    torch._dynamo.reset()
    return runs


def case() -> dict:
    runs = graphs_run()  # [forward 1, forward 2, recomputation 2, recomputation 1]
    return {"runs": runs, "recomputation_runs_forwards_graph": len(runs) == 4 and runs[3] == runs[0]}


def main() -> None:
    import torch

    out = {"torch": torch.__version__.split("+")[0], "python": sys.version.split()[0],
           "hotfix_before": "hotfix" in sys.modules}
    out["installed"] = case()
    hotfix = sys.modules.get("hotfix")  # a torch-only script: activated by its first non-reentrant checkpoint
    patch = hotfix.known_patches().get("torch-compile-recompute-graph") if hotfix is not None else None
    out["applied"] = bool(patch is not None and patch.applied)
    if hotfix is not None:
        hotfix.revert()
        out["upstream"] = case()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
