"""``torch.compile``'d code inside torch's non-reentrant checkpoint, once a frame holds two compiled graphs.

What breaks: Dynamo runs the first of a frame's graphs whose guards accept a call and moves it to the front (an LRU).
Called with changing shapes in checkpointed layers (a static graph for the first layer, a dynamic one compiled for
the second), the first layer's recomputation runs the dynamic graph, not its forward's: CheckpointError where the
two save other tensors (pytorch/pytorch#166926), silently wrong gradients where they compute a decision apart.

How this fixes it: the first non-reentrant checkpointed call turns the LRU off (``_set_lru_cache(False)``, torch
2.10 on; torchtitan#1991 / #2204 do the same): a frame's graphs keep the order they were compiled in, and a
recomputation finds its forward's.  Nothing changes in a process that never checkpoints; a program's own setting of
the switch stands.  Reentrant checkpointing is not reached (its forward runs without grad: other graphs anyway).
It cannot tell which recomputation would have run another graph: it says nothing.  Revert turns the LRU on again
where it turned it off (torch has no getter).  docs/fixes/torch-compile-recompute-graph.md.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing.torch_checkpoint import GENERATOR, MODULE, generator_drift

#: where torch (2.10 on) keeps the switch, and its name
SWITCH_MODULE = "torch._C._dynamo.eval_frame"
SWITCH = "_set_lru_cache"


def _switch_module() -> Any:
    """torch's C module holding the switch, or None (read as attributes: while torch imports, it is not yet in
    ``sys.modules`` under its name)."""
    switch_module = sys.modules.get("torch")
    for name in SWITCH_MODULE.split(".")[1:]:
        switch_module = getattr(switch_module, name, None)
    return switch_module


class TorchCompileRecomputeGraph(Patch):
    name = "torch-compile-recompute-graph"
    targets = (MODULE,)
    mechanisms = (
        Mechanism("recompute-other-graph", {"torch": ">=2.10.0"}, unreached={"torch": ">=2.4.0,<2.10.0"},
                  summary="torch.compile'd code in non-reentrant checkpointed layers with changing shapes: the "
                          "recomputation runs the graph compiled last (Dynamo's LRU), not the forward's: "
                          "CheckpointError or silently wrong gradients"),
    )
    symptom = ("CheckpointError 'different number of tensors was saved' / 'different metadata', or silently wrong "
               "gradients, with torch.compile'd code inside non-reentrant checkpointed layers whose shapes change")
    upstream = ("pytorch/pytorch#166926 (open); torchtitan#1991 and #2204 turn Dynamo's LRU cache off where "
                "activation checkpointing is applied")

    def __init__(self) -> None:
        super().__init__()
        # the switch needs no more thought: this fix turned it off, or the program set it (kept, not derived from the
        # two below: every later non-reentrant call reads it, one attribute)
        self._settled = False
        self._turned_off = False  # this fix turned the LRU off
        self._program_set: Optional[bool] = None  # what the program last set through the switch while the fix stood
        self._switch: Optional[Callable[[Any], None]] = None  # torch's own switch

    def _settle(self) -> None:
        with self._lock:
            if self._settled:
                return
            self._settled = True
            if self._program_set is None:
                self._switch(False)
                self._turned_off = True

    def _heard(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        """torch's switch, called by the program: its setting stands (recorded for revert)."""
        result = wrapped(*args, **kwargs)
        with self._lock:
            self._program_set = bool(args[0] if args else next(iter(kwargs.values())))
            self._settled = True
        if not self._program_set:
            return result
        self.warn_once("lru-on", "the program turned Dynamo's LRU cache on (_set_lru_cache(True)): left so; a "
                                 "checkpoint's recomputation may run another compiled graph than its forward "
                                 "(pytorch/pytorch#166926)")
        return result

    def _keep_graph_order(self) -> Callable:
        fix = self

        def idle(instance, args, kwargs) -> bool:  # settled: every later call is handed on as it is (hotfix.junction)
            return fix._settled

        def keep_graph_order(wrapped, instance, args, kwargs):  # named: wrapper chains read it
            if not fix._settled and not sys.modules["torch"].compiler.is_compiling():  # asked until settled
                fix._settle()
            return wrapped(*args, **kwargs)

        keep_graph_order.idle = idle
        return keep_graph_order

    def drift(self, module: Any) -> Optional[str]:
        if not callable(getattr(_switch_module(), SWITCH, None)):
            return f"{SWITCH_MODULE}.{SWITCH} is missing (torch 2.10 added it)"
        return generator_drift(module)

    def _apply(self, module: Any) -> None:
        switch_module = _switch_module()
        switch = switch_module.__dict__[SWITCH]
        self._switch = switch.__wrapped__ if self.installed(switch) else switch  # re-applied after a reload
        self.wrap(switch_module, SWITCH, self._heard)
        self.join(module, GENERATOR, self._keep_graph_order())

    def _revert(self) -> None:
        super()._revert()
        with self._lock:
            if self._turned_off and self._program_set is None:
                self._switch(True)  # torch's default; the program never set it while the fix stood
            self._settled = self._turned_off = False
            self._program_set = None


patch = TorchCompileRecomputeGraph()
