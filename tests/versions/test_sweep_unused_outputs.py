"""A checkpointed layer output that the loss never uses, on transformers 5.23.0, through the sweep's own path.

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
