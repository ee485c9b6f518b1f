"""DeepSpeed's ``partition_activations`` / ``cpu_checkpointing`` around transformers' layers (issue 42, part 4).

DeepSpeed's own ``deepspeed.checkpointing.checkpoint`` as the layers' checkpoint function (transformers'
``_set_gradient_checkpointing``), its options set as a user does (``deepspeed.checkpointing.configure``), DeepSpeed
0.19.8 from tests/matrix.txt, one process (its CPU accelerator, gloo), tiny Whisper on transformers 4.56.2 and 5.23.0,
every parameter and LoRA without the input hook; gradients compared with the same model without checkpointing.
With partitioning DeepSpeed takes a layer's inputs to be that layer's alone: after the forward it empties each
floating-point input, and it saves a non-tensor positional input as a pair its backward counts as one.

* upstream: 4.56.2 fails ("not enough values to unpack": the layer's tuple of one returned bare); 5.23.0 passes the
  encoder's states and the mask positionally to every decoder layer, DeepSpeed empties them after the first
  ("both arguments to linear need to be at least 1D, but they are 0D and 2D");
* with hotfix: every gradient equal, and one repair line of deepspeed-checkpoint-layer-io: on 4.56.2 the tuple of
  one, on 5.23.0 the non-tensor positional input before a tensor (the decoder's mask, ``None``, before the encoder's
  states), which DeepSpeed's recomputation moves one place on.  Before this repair hotfix failed too on 4.56.2: the
  ``encoder_hidden_states=`` it lifts into the inputs was emptied.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch  # its release names DeepSpeed's extensions folder (the children run this venv's torch)

from hotfix_lab.infra import deepspeed_env
from conftest import TRANSFORMERS_WARM, free_port, json_lines, matrix_path, repair_notices, run_python
from support import evidence

CHILD = r"""
import json, sys
import torch, transformers
import deepspeed
from hotfix_lab.infra import tiny_models
from hotfix.diagnostics.compare import collect_grads, compare_grads

deepspeed.init_distributed(dist_backend="gloo")
BUILDERS = {"whisper": tiny_models.whisper, "whisper-lora": tiny_models.whisper_lora_no_hook}
GROUPS = {"partition": {"partition": dict(partition_activations=True),
                        "partition+cpu": dict(partition_activations=True, checkpoint_in_cpu=True)},
          "cpu": {"cpu": dict(checkpoint_in_cpu=True)}}
OPTIONS = GROUPS[sys.argv[1]]
if sys.argv[1] == "cpu":  # cpu_checkpointing alone, as on an accelerator: its host copy a tensor of its own
    from hotfix_lab.infra import deepspeed_env
    deepspeed_env.stand_in_host_copy()

def grads(recipe, options):
    model, batch = BUILDERS[recipe]()
    if options is not None:
        model.gradient_checkpointing_enable()
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
        deepspeed.checkpointing.configure(None, **options)
    model(**batch).loss.backward()
    return collect_grads(model)

for recipe in BUILDERS:
    reference = grads(recipe, None)
    for name, options in OPTIONS.items():
        try:
            row = {"equal": compare_grads(reference, grads(recipe, options)).ok}
        except Exception as exc:
            row = {"error": f"{type(exc).__name__}: {exc}"[:160]}
        print(json.dumps({"case": f"{recipe}:{name}", **row}), flush=True)
"""

VERSIONS = ["4.56.2", "5.23.0"]
DEEPSPEED = "0.19.8"
OPTIONS = {"partition": ("partition", "partition+cpu"), "cpu": ("cpu",)}
UPSTREAM_ERROR = {"4.56.2": "not enough values to unpack", "5.23.0": "0D and 2D"}
# the first repair said, in each process: 4.56.2 the tuple of one; 5.23.0 with partitioning the decoder's mask (None)
# before its encoder states, with cpu_checkpointing alone (no shift there) the encoder states kept whole
REPAIRED = {("4.56.2", "partition"): "tuple of one", ("5.23.0", "partition"): "non-tensor positional input",
            ("4.56.2", "cpu"): "tuple of one", ("5.23.0", "cpu"): "kept whole"}
#: what an upstream half is made of (support/evidence.py adds the lab's infrastructure and the comparison rule)
GUARDS = ("tests/versions/test_deepspeed_partitioned_activations.py",)


def _run(version, group, hotfix):
    release = matrix_path("deepspeed", DEEPSPEED)
    env = dict(deepspeed_env.cpu_env(release, torch.__version__), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_PORT=str(free_port()), **({} if hotfix else {"HOTFIX_DISABLE": "1"}))
    proc = run_python(["-c", CHILD, group], pythonpath=[matrix_path("transformers", version), release], env=env,
                      timeout=300, warm=TRANSFORMERS_WARM)
    rows = {row.pop("case"): row for row in json_lines(proc.stdout)}
    assert sorted(rows) == sorted(_cases(group)), proc.stderr[-3000:]
    return rows, repair_notices(proc.stderr)


def _cases(group):
    return [f"{recipe}:{options}" for recipe in ("whisper", "whisper-lora") for options in OPTIONS[group]]


def _upstream(version, group):
    """The child without hotfix, recorded (tests/evidence/deepspeed-partitioned-activations.json): each case's error
    text, and the repair lines said (none)."""
    parts = {"transformers": version, "group": group, "deepspeed": DEEPSPEED, "torch": torch.__version__}
    return evidence.upstream("deepspeed-partitioned-activations", f"{version}:{group}", parts, GUARDS,
                             lambda: _run(version, group, False), lambda result: result)


@pytest.mark.parametrize("group", list(OPTIONS))
@pytest.mark.parametrize("version", VERSIONS)
def test_partitioned_activations_fail_upstream_and_train_equal_with_hotfix(version, group):
    """``cpu``: cpu_checkpointing alone, its accelerator path (DeepSpeed's host copy a tensor of its own, as the child
    stands in for): the encoder's states every decoder layer reads are emptied after the first (5.23.0)."""
    with ThreadPoolExecutor(2) as pool:
        upstream, fixed = pool.submit(_upstream, version, group), pool.submit(_run, version, group, True)
        (upstream, upstream_notices), (fixed, notices) = upstream.result(), fixed.result()
    assert upstream_notices == []
    for case in _cases(group):
        assert UPSTREAM_ERROR[version] in upstream[case].get("error", ""), (case, upstream[case])
        assert fixed[case] == {"equal": True}, (case, fixed[case])
    said = [line for line in notices if "deepspeed-checkpoint-layer-io" in line]
    assert len(said) == 1 and REPAIRED[version, group] in said[0], notices
