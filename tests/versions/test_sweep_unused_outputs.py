"""Layer outputs a reentrant checkpoint mishandles, through the sweep's own path: unused (LiLT, 5.23.0), nested (4.52.4).

Found by the sweep.  The test runs LiLT upstream (``HOTFIX_DISABLE=1``) and with hotfix, through torch's
checkpoint function and unsloth-zoo's ``UnslothCheckpointFunction``, against a run without checkpointing
(transformers-checkpoint-layer-io, ``FlatOutputs.watch_unused``; in-process reproduction in
tests/unit/test_checkpoint_outputs.py).
"""

from __future__ import annotations

from conftest import assert_sweep_cells, run_sweep


def test_lilt_unused_layout_output_gets_zeros_upstream_and_no_gradient_with_hotfix(tmp_path):
    """LiltLayer returns (text, layout); LiltEncoder discards the last layer's layout output.  A reentrant
    checkpoint is an autograd.Function, handed zeros for an output nothing used, and its recomputation
    backpropagates them: upstream the layout weights feeding only that output get zero gradients where the
    run without checkpointing has none ("unexpected"), through torch's and unsloth's function alike;
    non-reentrant is exact.  With hotfix the recomputation detaches the output that got no gradient, and
    every gradient (and every absent one) equals the run without checkpointing."""
    rows = run_sweep(tmp_path, "5.23.0", "lilt", "full")
    assert_sweep_cells(rows, 4, upstream=lambda reentrant: reentrant["status"] == "wrong"
                       and "unexpected" in reentrant["summary"]
                       and reentrant["missing"] == 0 and reentrant["wrong"] == 0)  # only the zeros


def test_nested_outputs_of_a_model_that_calls_its_checkpoint_function_itself(tmp_path):
    """Before 4.53 LiLT's and pvt_v2's encoders call ``self._gradient_checkpointing_func(layer.__call__, ...)``
    themselves (no GradientCheckpointingLayer); their layers return nested outputs (LiLT ``((text, layout),)``,
    pvt_v2 ``((hidden,), h, w)``), which a reentrant checkpoint cuts off: upstream most gradients are missing,
    through both functions.  With hotfix the slot on the encoder's class returns them as checkpoint outputs."""
    for model in ("lilt", "pvt_v2"):
        (tmp_path / model).mkdir()
        rows = run_sweep(tmp_path / model, "4.52.4", model, "full")
        assert_sweep_cells(rows, 4, upstream=lambda reentrant: reentrant["status"] == "wrong"
                           and reentrant["missing"] > 0)
