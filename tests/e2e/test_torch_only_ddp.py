"""A torch-only script under DDP(find_unused_parameters=True), hotfix installed, no `import hotfix` (issue 50, part 4).

torch-ddp-find-unused repairs torch's reentrant checkpoint entered directly under DDP with find_unused_parameters
("Expected to mark a variable ready only once"), but a script importing torch and no transformers never activated
hotfix.  Now the start-up hook watches torch's DistributedDataParallel.__init__ once torch is imported (a plain
function on the class, no import): the first DDP built activates hotfix, and torch's own __init__ goes back.

Three shapes of script, one launch per mode for all (tests/support/torch_only_ddp.py's docstring): a plain module's
blocks; diffusers' UNet2DModel with ``enable_gradient_checkpointing(partial(checkpoint, use_reentrant=True))``
(diffusers from .matrix/, imported as where transformers is not installed: with transformers installed diffusers
0.39.0 imports it, and that import activates hotfix before any DDP); a Hub-style model file loaded by path whose
``from torch.utils.checkpoint import checkpoint`` was bound before hotfix was active, its layers checkpointing a
bound method.  Measured 2026-11-29, torch 2.13.0+cpu, diffusers 0.39.0: upstream each case "Expected to mark a
variable ready only once" on both ranks; with hotfix each equal to no checkpointing (blocks 8/8, UNet 144/144,
Hub-style 25/25 parameter gradients), hotfix activated by the first DDP, transformers never loaded.  timm's
``checkpoint_seq`` (its ConvNeXt and ViT) in the side venv of torch 2.11.0, where PyPI has a torchvision
(2026-11-29, timm 1.0.31, torchvision 0.26.0): upstream the same error, with hotfix 65/65 and 44/44 equal."""

from __future__ import annotations

import pytest

from conftest import MATRIX, SUPPORT, launch_ranks, matrix_path, repair_notices, run_python

SCRIPT = SUPPORT / "torch_only_ddp.py"
DIFFUSERS = "0.39.0"  # tests/matrix.txt


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """(upstream's results, hotfix's results, hotfix's launcher process): every case, one launch per mode."""
    folder = tmp_path_factory.mktemp("torch_only_ddp")
    diffusers = MATRIX / f"diffusers-{DIFFUSERS}"
    pythonpath = [diffusers] if (diffusers / ".complete").exists() else []  # without it: the unet case skips
    upstream, _ = launch_ranks(folder / "up", SCRIPT, ranks=2, disabled=True, pythonpath=pythonpath)
    fixed, proc = launch_ranks(folder / "hf", SCRIPT, ranks=2, pythonpath=pythonpath)
    return upstream, fixed, proc


def test_torch_only_ddp_trains_equal_with_hotfix_installed(launches):
    upstream, fixed, proc = launches
    for rank in (0, 1):
        assert upstream[rank]["hotfix_after"] is False, upstream[rank]
        assert upstream[rank]["transformers_loaded"] is False, upstream[rank]
        assert "ready only once" in upstream[rank]["cases"]["blocks"].get("error", ""), upstream[rank]
        seen = fixed[rank]
        # every module imported, the Hub file loaded and every model built before the first DDP: hotfix still off
        assert seen["transformers_loaded"] is False and seen["hotfix_before_ddp"] is False, seen
        assert seen["hotfix_after"] is True, seen
        case = seen["cases"]["blocks"]
        assert case["ok"] and case["equal"] and case["missing"] == 0, case
    assert any("torch-ddp-find-unused" in line for line in repair_notices(proc.stderr)), proc.stderr[-2000:]


@pytest.mark.parametrize("name", ["unet", "hub_style"])
def test_a_unet_and_a_hub_style_model_train_equal_in_the_same_script(launches, name):
    if name == "unet":
        matrix_path("diffusers", DIFFUSERS)  # skips where .matrix/ lacks it (fails in CI)
    upstream, fixed, _ = launches
    for rank in (0, 1):
        assert "ready only once" in upstream[rank]["cases"][name].get("error", ""), upstream[rank]
        seen = fixed[rank]
        assert seen["transformers_loaded"] is False and seen["hotfix_before_ddp"] is False, seen
        assert seen["hotfix_after"] is True, seen
        case = seen["cases"][name]
        assert case["ok"] and case["equal"] and case["missing"] == 0, case
        if name == "unet":
            assert seen["diffusers"] == DIFFUSERS, seen
        else:  # the name the Hub file bound at load is torch's own function, in both modes
            assert upstream[rank]["hub_checkpoint_is_torchs"] is True and seen["hub_checkpoint_is_torchs"] is True


#: timm needs torchvision, which PyPI has for none of the test venv's CPU torch: timm's cases run in the side venv of
#: torch 2.11, with PyPI's torchvision for it and timm beside it (tools/hotfix_lab/infra/matrix_install.py BESIDE_TORCH)
TIMM_TORCH = "2.11.0"


@pytest.mark.side_torch
def test_timm_checkpoint_seq_under_ddp_trains_equal_with_hotfix_installed(tmp_path):
    """timm's ConvNeXt and ViT with ``set_grad_checkpointing()`` and timm's opt-in to reentrant checkpointing: their
    ``checkpoint_seq`` checkpoints each block through a closure over the tuple of blocks (the layer is not the
    function handed to torch)."""
    python = str(matrix_path("torch", TIMM_TORCH) / "bin" / "python")
    paths = [matrix_path("timm", f"torch{TIMM_TORCH}")]
    cases = ["timm_convnext", "timm_vit"]
    upstream, _ = launch_ranks(tmp_path / "up", SCRIPT, cases, disabled=True, pythonpath=paths, python=python)
    fixed, proc = launch_ranks(tmp_path / "hf", SCRIPT, cases, pythonpath=paths, python=python)
    for rank in (0, 1):
        assert upstream[rank]["torch"].startswith(TIMM_TORCH) and upstream[rank]["hotfix_after"] is False
        seen = fixed[rank]
        assert seen["transformers_loaded"] is False and seen["hotfix_before_ddp"] is False, seen
        assert seen["hotfix_after"] is True, seen
        assert seen["timm"] == upstream[rank]["timm"], seen
        for case in cases:
            assert "ready only once" in upstream[rank]["cases"][case].get("error", ""), upstream[rank]
            found = seen["cases"][case]
            assert found["ok"] and found["equal"] and found["missing"] == 0, (case, found)
    assert any("torch-ddp-find-unused" in line for line in repair_notices(proc.stderr)), proc.stderr[-2000:]


def test_the_watch_leaves_torch_alone_until_a_ddp_is_built_and_then_goes():
    probe = ("import sys, torch; from torch.nn.parallel import DistributedDataParallel as D; "
             "watched = D.__init__.__qualname__; "
             "import transformers; print(watched, '|', D.__init__.__qualname__, '|', 'hotfix' in sys.modules)")
    proc = run_python(["-c", probe], timeout=120)
    watched, after, active = (part.strip() for part in proc.stdout.strip().split("|"))
    assert watched.endswith("watch_torch.<locals>.__init__"), proc.stdout + proc.stderr
    assert after == "DistributedDataParallel.__init__" and active == "True", proc.stdout  # a trigger: watch gone
    plain = run_python(["-c", "import sys, torch; print('hotfix' in sys.modules)"], timeout=120)
    assert plain.stdout.strip() == "False"  # importing torch activates nothing
