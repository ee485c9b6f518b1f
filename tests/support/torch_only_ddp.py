"""Torch-only DDP scripts (no transformers, no `import hotfix`) calling torch's reentrant checkpoint under
DDP(find_unused_parameters=True), one case each.  Launched by tests/e2e/test_torch_only_ddp.py with torchrun:
RESULT_DIR first (tools/hotfix_lab/infra/rank_results.py's protocol).

- ``blocks``: a plain module's blocks call ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)``, a
  parameter never used (why the flag is set).
- ``unet``: diffusers' ``UNet2DModel`` (tiny, random, built from its config: no download) with
  ``enable_gradient_checkpointing(partial(torch.utils.checkpoint.checkpoint, use_reentrant=True))``: its blocks call
  ``self._gradient_checkpointing_func(resnet, hidden_states, temb)``, the resnet module itself.  Every parameter of
  this UNet is used (DDP's reducer warns it "did not find any unused parameters" in the run without
  checkpointing), so none was added: upstream fails all the same (measured 2026-11-29, also with this case alone in
  the process), as patches/torch_ddp_find_unused.py describes: DDP's search at the end of the forward does not see
  the checkpointed resnets' parameters (their forward ran under no_grad) and marks them ready, and the
  recomputation in backward marks them again.  diffusers is put on PYTHONPATH by the test (.matrix/diffusers-<version>).
  transformers: diffusers 0.39.0 imports it whenever it is installed (measured 2026-11-29): the first import of any
  model (``from diffusers import UNet2DModel`` and ``import diffusers.models.unets.unet_2d`` alike) runs
  ``diffusers.quantizers.pipe_quant_config``, whose ``from transformers.utils.quantization_config import ...`` sits
  in a ``try/except ImportError`` at module level (and, with peft installed, ``diffusers.loaders.peft`` imports
  peft, which imports transformers).  The test venv has both installed (hotfix's tests need them), and importing
  transformers would activate hotfix before any DDP: another path, not this one (measured once with nothing
  hidden: transformers loaded, hotfix active before the DDP, 144/144 equal).  So the script hides transformers
  and peft while it imports diffusers (``sys.modules[name] = None``: ``import`` raises ImportError and
  ``importlib.util.find_spec`` answers None, as where they are not installed; diffusers' ``is_transformers_available``
  and ``is_peft_available`` are then False), and takes the entries away after: the script's environment is a
  diffusers install without transformers (peft requires it), which diffusers supports.  diffusers still imports
  accelerate (installed in the venv; it imports no transformers and does not activate hotfix).
  ``transformers_loaded`` is read at the end.
- ``hub_style``: tests/support/hub_style_model.py loaded by path as trust_remote_code loads a Hub model's file: its
  ``from torch.utils.checkpoint import checkpoint`` binds torch's function at load, before hotfix is active, and its
  layers call ``checkpoint(self._block_forward, x, use_reentrant=True)`` on a bound method.
- ``timm_convnext``, ``timm_vit`` (named by the launcher; where timm imports: torch 2.11's side venv): timm's tiny
  ConvNeXt and ViT (``TIMM_MODELS``) with ``set_grad_checkpointing()`` and timm's opt-in to reentrant
  checkpointing (``set_reentrant_ckpt(True)``): ``checkpoint_seq`` checkpoints each block through a closure over
  the tuple of blocks.

Every model (with and without checkpointing, the same weights) is built, and every module imported or loaded,
before the first DDP: ``hotfix_before_ddp`` is read then, so each case's checkpoint function was bound while hotfix
was still off (with hotfix installed, the first DDP built activates it).  Each rank trains one step with
checkpointing and one without (its share of the batch), under DDP built the same way, and records every gradient's
comparison (hotfix's rule, loaded without importing hotfix), and whether hotfix and transformers were loaded."""

import datetime
import functools
import os
import sys

import torch
import torch.distributed as dist
import torch.utils.checkpoint

from hotfix_lab.infra import rank_results  # tools/hotfix_lab
from hotfix_lab.infra import standalone  # tools/hotfix_lab

compare = standalone.load("compare")
CASES = ["blocks", "unet", "hub_style"]  # the default; timm's (TIMM_MODELS) run where timm is installed
HUB_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hub_style_model.py")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Model(torch.nn.Module):
    def __init__(self, checkpointing):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.unused = torch.nn.Linear(8, 8)
        self.checkpointing = checkpointing

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True) if self.checkpointing else block(x)
        return x.square().mean()


def blocks_step(model, rank, world):
    x = torch.randn(4 * world, 8, generator=torch.Generator().manual_seed(1)).chunk(world)[rank]
    return model(x.requires_grad_(True))


#: what an install of diffusers without transformers lacks: transformers, and peft (it requires transformers)
HIDDEN = ("transformers", "peft")


def import_unet():
    """diffusers' UNet2DModel, imported as where transformers is not installed (the module docstring)."""
    hidden = [name for name in HIDDEN if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None
    try:
        import diffusers
        from diffusers import UNet2DModel
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return UNet2DModel, diffusers.__version__


def unet(unet_class, checkpointing):
    torch.manual_seed(0)
    model = unet_class(sample_size=8, in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
                       norm_num_groups=4, attention_head_dim=4, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    if checkpointing:
        model.enable_gradient_checkpointing(functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=True))
    return model.train()


def unet_step(model, rank, world):
    generator = torch.Generator().manual_seed(1)
    sample = torch.randn(2 * world, 3, 8, 8, generator=generator).chunk(world)[rank]
    target = torch.randn(2 * world, 3, 8, 8, generator=generator).chunk(world)[rank]
    timesteps = torch.randint(0, 1000, (2 * world,), generator=generator).chunk(world)[rank]
    (predicted,) = model(sample, timesteps, return_dict=False)
    return torch.nn.functional.mse_loss(predicted, target)


def load_hub_file():
    """The Hub-style model file by path, under a name of its own, as a remote-code loader does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hub_modules.hub_style_model", HUB_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def hub_style(module, checkpointing):
    torch.manual_seed(0)
    model = module.HubStyleModel()
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model.train()


def hub_step(model, rank, world):
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 32, (2 * world, 6), generator=generator).chunk(world)[rank]
    labels = torch.randint(0, 32, (2 * world, 6), generator=generator).chunk(world)[rank]
    return model(input_ids, labels)


def import_timm(out):
    """timm, with its opt-in to torch's reentrant checkpoint (``TIMM_REENTRANT_CKPT=1`` alike; its default is
    non-reentrant)."""
    import timm
    from timm.layers import set_reentrant_ckpt

    set_reentrant_ckpt(True)
    out["timm"] = timm.__version__
    return timm


#: timm models as small as they build (random weights, no download); 32x32 images, 4 classes.  Both checkpoint their
#: blocks with ``timm.models.checkpoint_seq`` (a segment runner: the blocks in a tuple inside its closure)
TIMM_MODELS = {
    "timm_convnext": ("convnext_atto", dict(depths=(1, 1, 2, 1), dims=(8, 16, 24, 32))),
    "timm_vit": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2)),
}


def timm_model(timm, case, checkpointing):
    name, sizes = TIMM_MODELS[case]
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=4, **sizes)
    model.set_grad_checkpointing(checkpointing)
    return model.train()


def timm_step(model, rank, world):
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(2 * world, 3, 32, 32, generator=generator).chunk(world)[rank]
    labels = torch.randint(0, 4, (2 * world,), generator=generator).chunk(world)[rank]
    return torch.nn.functional.cross_entropy(model(images), labels)


def build(out, cases):
    """{case: (step, model without checkpointing, model with)} for ``cases``; a case whose code cannot be imported is
    left out (recorded as its error)."""
    built = {}
    for case in cases:
        try:
            if case == "blocks":
                built[case] = (blocks_step, Model(False), Model(True))
            elif case == "unet":
                unet_class, out["diffusers"] = import_unet()
                built[case] = (unet_step, unet(unet_class, False), unet(unet_class, True))
            elif case == "hub_style":
                module = load_hub_file()
                out["hub_checkpoint_is_torchs"] = module.checkpoint is torch.utils.checkpoint.checkpoint
                built[case] = (hub_step, hub_style(module, False), hub_style(module, True))
            else:
                timm = import_timm(out)
                built[case] = (timm_step, timm_model(timm, case, False), timm_model(timm, case, True))
        except Exception as exc:
            out["cases"][case] = {"ok": False, "error": compare.short_error(exc)}
    return built


def grads(step, model, rank, world):
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    step(ddp, rank, world).backward()
    return compare.collect_grads(ddp.module)


def main():
    result_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank, "world": world, "torch": torch.__version__, "cases": {}}
    cases = sys.argv[2:] or CASES  # a launcher may name some
    built = build(out, cases)
    out["hotfix_before_ddp"] = "hotfix" in sys.modules

    def run(case):
        step, reference, checkpointed = built[case]
        found = compare.compare_grads(grads(step, reference, rank, world), grads(step, checkpointed, rank, world))
        return {"ok": True, "equal": found.ok, "missing": len(found.missing), "summary": found.summary()}

    rank_results.run_cases(out, [case for case in cases if case in built], run, compare.short_error, dist.barrier)
    out["hotfix_after"] = "hotfix" in sys.modules
    out["transformers_loaded"] = "transformers" in sys.modules
    rank_results.write_rank_file(result_dir, out)
    rank_results.leave()


if __name__ == "__main__":
    main()
