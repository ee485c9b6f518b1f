"""Under ``torch.compile`` hotfix stays out of dynamo's way.

Dynamo traces ``torch.utils.checkpoint`` as its own higher-order op, which
tracks closure tensors and parameters itself: compiled reentrant
checkpointing trains correctly without hotfix (4.56.2).  hotfix's wrapper
used to be a graph break there ("Dynamo does not know how to trace the
function FunctionWrapper"; 11 graphs instead of 5, recompiles on guards of
tensor ids).  The class-level slots (``hotfix.patches._checkpoint_slot``) now hand
dynamo the raw checkpoint function.

One child per (backend, model, hotfix on/off): two compiled training steps,
counting dynamo's graphs, graph breaks and compiled frames, and comparing
gradients with an uncompiled step without checkpointing.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import json_lines, run_python

CHILD = r"""
import json, sys
import torch, torch._dynamo
from torch._dynamo.utils import counters
import tiny_models

backend, which = sys.argv[1], sys.argv[2]
model, batch = tiny_models.whisper(0)
model.config.dropout = 0.0
if which == "qv-only":  # LoRA-like: nothing reaching a layer needs grad (frozen-inputs' case)
    for name, p in model.named_parameters():
        p.requires_grad_(name.split(".")[-2] in ("q_proj", "v_proj"))

def grads():
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters() if p.requires_grad}

model.zero_grad(set_to_none=True); model(**batch).loss.backward(); reference = grads()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
compiled = torch.compile(model, backend=backend)
equal = []
for _ in range(2):
    model.zero_grad(set_to_none=True)
    compiled(**batch).loss.backward()
    got = grads()
    equal.append(all((got[k] is None) == (reference[k] is None) and
                     (reference[k] is None or torch.allclose(got[k], reference[k], rtol=1e-4, atol=1e-6)) for k in reference))
reasons = " | ".join(counters["graph_break"])
print(json.dumps({
    "hotfix": "hotfix.registry" in sys.modules and sys.modules["hotfix.registry"].registry.active,
    "graphs": counters["stats"]["unique_graphs"],
    "breaks": sum(counters["graph_break"].values()),
    "frames": counters["frames"]["ok"],
    "hotfix_in_breaks": "FunctionWrapper" in reasons or "hotfix" in reasons,
    "grads_equal": equal,
}))
"""


def _run(backend, which, disabled):
    env = {"OMP_NUM_THREADS": "1"}
    if disabled:
        env["HOTFIX_DISABLE"] = "1"
    proc = run_python(["-c", CHILD, backend, which], env=env, timeout=500)
    lines = json_lines(proc.stdout)
    assert lines, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("which", ["full", "qv-only"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_reentrant_checkpointing_same_graphs_with_and_without_hotfix(backend, which):
    with ThreadPoolExecutor(2) as pool:
        without, with_hotfix = pool.map(lambda disabled: _run(backend, which, disabled), (True, False))
    assert without["hotfix"] is False and with_hotfix["hotfix"] is True
    assert without["grads_equal"] == [True, True], without  # compiled: correct upstream already
    assert with_hotfix["grads_equal"] == [True, True], with_hotfix
    assert with_hotfix["hotfix_in_breaks"] is False, with_hotfix
    for key in ("graphs", "breaks", "frames"):  # frames: no recompilation caused by hotfix
        assert with_hotfix[key] == without[key], (key, without, with_hotfix)
