"""Issue 27 on real releases: a GradientCheckpointingLayer writing into the mapping it is handed.

Two subclasses of transformers' ``GradientCheckpointingLayer`` (tests/support/shared_state_cases.py:
store a tensor needing grad, bump a counter, append to a list, write into a nested dict, delete a
key; the next layer reads the tensors), reentrant checkpointing through torch's function, through
unsloth-zoo's ``UnslothCheckpointFunction`` (2026.10.9 loaded on CPU) and through DeepSpeed's
``deepspeed.checkpointing.checkpoint`` (0.19.8, its CPU accelerator, one process), on 4.56.2 and 5.23.0, for every
mapping type.  Without hotfix the caller's mapping after backward and the gradients differ from the
run without checkpointing; with hotfix both equal it (keys in order, values, nested), or, for a mapping
that cannot be copied and for a tensor changed in place through the mapping, one ``hotfix:`` line says so.
One child per (release, function, hotfix on/off) runs every case.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch  # its release names DeepSpeed's extensions folder (the children run this venv's torch)

from hotfix_lab.infra import deepspeed_env
from conftest import TRANSFORMERS_WARM, hotfix_lines, json_lines, matrix_path, run_python
from support import evidence

CHILD = r"""
import functools, json, sys
import torch, transformers
from transformers.modeling_layers import GradientCheckpointingLayer
import shared_state_cases as cases
from hotfix.diagnostics.compare import collect_grads, compare_grads

checkpoint_function = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=True)
if sys.argv[1] == "unsloth":
    from hotfix_lab.infra import zoo_loader
    zoo_loader.install_unsloth_swap(zoo_loader.load_release())
elif sys.argv[1] == "deepspeed":  # DeepSpeed's own function in transformers' place (issue 42, part 4): one process
    import deepspeed
    checkpoint_function = deepspeed.checkpointing.checkpoint

class Layer(GradientCheckpointingLayer):
    def __init__(self, index, forward):
        super().__init__()
        self.index, self._forward = index, forward
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, hidden, state=None):
        return self._forward(self, hidden, state)

def run(mapping, checkpointing, in_place=False):
    torch.manual_seed(0)
    forward = cases.in_place_forward if in_place else cases.writer_forward
    layers = torch.nn.ModuleList([Layer(i, forward) for i in range(2)]).train()
    for layer in layers:
        layer.gradient_checkpointing = checkpointing
        layer._gradient_checkpointing_func = checkpoint_function
    state = cases.initial_state(cases.MAPPINGS[mapping], in_place)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    for layer in layers:
        x = layer(x, state=state)
    after_forward = cases.snapshot(state)
    try:
        cases.loss_of(x, state, in_place).backward()
    except RuntimeError as exc:
        return None, after_forward, None, f"crash: {exc}"[:100]
    return collect_grads(layers), after_forward, cases.snapshot(state), None

for mapping, in_place in [(m, False) for m in cases.MAPPINGS] + [("dict", True)]:
    reference, ref_forward, ref_backward, _ = run(mapping, False, in_place)
    grads, after_forward, after_backward, crash = run(mapping, True, in_place)
    print(json.dumps({
        "case": mapping + (" in place" if in_place else ""),
        "crash": crash,
        "grads_equal": None if crash else compare_grads(reference, grads).ok,
        "forward_equal": cases.same(ref_forward, after_forward),
        "backward_equal": None if crash else cases.same(ref_backward, after_backward),
    }), flush=True)
"""

VERSIONS = ["4.56.2", "5.23.0"]
FUNCTIONS = ["torch", "unsloth", "deepspeed"]
DEEPSPEED = "0.19.8"
REPAIRED = ["dict", "UserDict", "OrderedDict", "defaultdict", "SharedStorage"]
#: what an upstream half is made of (support/evidence.py adds the lab's infrastructure and the comparison rule)
GUARDS = ("tests/versions/test_shared_state_mappings.py", "tests/support/shared_state_cases.py")


def _run(version, function, hotfix):
    paths = [matrix_path("transformers", version)]
    env = {} if hotfix else {"HOTFIX_DISABLE": "1"}
    if function == "unsloth":
        paths.append(matrix_path("unsloth-zoo", "2026.10.9"))
    if function == "deepspeed":  # its CPU accelerator, its extensions built in its own folder
        paths.append(matrix_path("deepspeed", DEEPSPEED))
        env.update(deepspeed_env.cpu_env(paths[-1], torch.__version__))
    proc = run_python(["-c", CHILD, function], pythonpath=paths, env=env, timeout=300, warm=TRANSFORMERS_WARM)
    rows = {row["case"]: row for row in json_lines(proc.stdout)}
    assert len(rows) == 7, proc.stderr[-3000:]
    return rows, hotfix_lines(proc.stderr)


def _upstream(version, function):
    """The child without hotfix, recorded (tests/evidence/shared-state-mappings.json): every row is a verdict or an
    error text, and the lines hotfix printed (none)."""
    parts = {"transformers": version, "function": function, "torch": torch.__version__,
             "release": {"unsloth": "unsloth-zoo 2026.10.9", "deepspeed": f"deepspeed {DEEPSPEED}"}.get(function)}
    return evidence.upstream("shared-state-mappings", f"{version}:{function}", parts, GUARDS,
                             lambda: _run(version, function, False), lambda result: result)


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("version", VERSIONS)
def test_shared_mappings_upstream_and_with_hotfix(version, function):
    with ThreadPoolExecutor(2) as pool:
        upstream, fixed = pool.submit(_upstream, version, function), pool.submit(_run, version, function, True)
        upstream, fixed = upstream.result(), fixed.result()
    upstream, upstream_lines = upstream
    fixed, lines = fixed
    assert upstream_lines == []
    for case in REPAIRED:
        broken = upstream[case]
        # upstream: the stored tensors are constants (wrong gradients) and the recomputation writes again
        assert broken["crash"] or broken["grads_equal"] is False or broken["backward_equal"] is False, broken
        assert fixed[case] == {"case": case, "crash": None, "grads_equal": True, "forward_equal": True,
                               "backward_equal": True}, fixed[case]
    # the reported cases: as upstream (never worse), and one line each
    for case in ("Uncopyable", "dict in place"):
        assert fixed[case]["grads_equal"] is not True, fixed[case]
        assert (fixed[case]["crash"] is None) == (upstream[case]["crash"] is None), (upstream[case], fixed[case])
    assert len(lines) == 2, lines
    assert any("handed a Uncopyable that cannot be copied privately" in line for line in lines), lines
    assert any("changes in place a tensor it received through a mapping" in line for line in lines), lines
