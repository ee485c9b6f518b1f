"""unsloth-zoo's MoE paths under checkpointing, on CPU: its fused router (2026.10.8+) and its block forwards.

    python zoo_moe.py [--fused-router [--kernel release]] [--block-forwards] [--late]
                      [--device cuda --dtype bfloat16] CASE [CASE ...]
                                one JSON line per case (tools/hotfix_lab, a release from 2026.10.8 and transformers 5.x
                                first on PYTHONPATH)

``--fused-router`` (``UNSLOTH_MOE_FUSED_ROUTER=1``): the release's ``temporary_patches/moe_router_triton.py`` is loaded
on CPU (zoo_loader: its package's ``__init__`` never runs) and its own ``patch_moe_fused_router()`` swaps transformers'
router classes' ``forward`` for the fused one, as unsloth does when it loads.  One thing does not run: the Triton
kernel.  In its place (the module's ``moe_router``, which the release's gate ``fused_route_or_none`` calls) a
stand-in counts its calls and answers with the release's own eager reference, ``moe_router_reference``: like the
kernel, it chooses the experts inside itself, where no ``topk`` of the model's code is called; ``_supported`` answers
for CPU tensors as it does for CUDA ones.  ``--kernel release`` (a GPU with Triton: the GPU kit's extras) keeps the
release's kernel and counts its launches instead (its ``_router_fwd_impl``).  ``--block-forwards``: the release's
``patch_qwen3_moe()`` swaps Qwen3-MoE's sparse block forward for unsloth's own (its experts backend runs on CPU on
transformers 5.x).

Each CASE is one of moe_cases.py's (``MODEL:MODE[:nodrift]``: the drift device, one step without checkpointing and
one with it), its JSON line with ``kernel_calls`` (the kernel's calls over both steps),
``kernel_recomputations`` (those made inside autograd's backward: a checkpoint's recomputation), ``fused``: the
router classes the release's patch swapped, ``block_forward``: the module Qwen3-MoE's block forward comes from, and
``callers_on_the_gate``: which of the release's modules that import the gate under a name of their own
(``qwen3_moe``, ``qwen3_vl_moe``, ``gpt_oss``, ``moe_grouped_modulelist``) read hotfix's gate there.  With
``--fused-router``, a last line: which of them, calling the gate by that name, the kernel answered outside a
checkpoint, and which were told to route eagerly inside one.  ``--late``: those modules are loaded before hotfix
activates (start the child with ``HOTFIX_DISABLE=1``; it calls ``hotfix.activate()`` itself), as where a script
imports unsloth before hotfix.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

#: the release's modules that import the gate as ``_fused_route_or_none``
CALLERS = ("qwen3_moe", "qwen3_vl_moe", "gpt_oss", "moe_grouped_modulelist")


def install(late: bool, fused_router: bool, block_forwards: bool, kernel: str = "stand-in") -> dict:
    import torch
    importlib.import_module("transformers")  # a real run imports it first; hotfix activates with it

    from hotfix_lab.cases import moe_cases
    from hotfix_lab.infra import zoo_loader

    if fused_router:
        os.environ["UNSLOTH_MOE_FUSED_ROUTER"] = "1"
    router = zoo_loader.load_temporary_patch("moe_router_triton")
    callers = [zoo_loader.load_temporary_patch(name) for name in CALLERS]
    if late:  # started with HOTFIX_DISABLE=1: upstream until here (zoo_routing.py's "activate")
        os.environ.pop("HOTFIX_DISABLE", None)
        import hotfix

        assert hotfix.activate(), "hotfix did not activate"
    counts = {"kernel_calls": 0, "kernel_recomputations": 0}

    def counted(run):
        def kernel(*args, **kwargs):  # chooses the experts inside itself
            counts["kernel_calls"] += 1
            counts["kernel_recomputations"] += moe_cases.in_backward()
            return run(*args, **kwargs)

        return kernel

    if fused_router and kernel == "release":  # the release's Triton kernel, its launches counted
        router._router_fwd_impl = counted(router._router_fwd_impl)
    elif fused_router:  # its stand-in, on any device: the release's eager reference
        router.HAS_TRITON = True
        router._supported = lambda logits, top_k, n_group: isinstance(logits, torch.Tensor) and logits.dim() == 2
        router.moe_router = counted(router.moe_router_reference)
    if fused_router:
        router.patch_moe_fused_router()
    if block_forwards:
        callers[CALLERS.index("qwen3_moe")].patch_qwen3_moe()
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    gate = router.fused_route_or_none
    return {"counts": counts, "fused": sorted(router._SUPPORTED), "callers": callers,
            "block_forward": modeling_qwen3_moe.Qwen3MoeSparseMoeBlock.forward.__module__,
            "callers_on_the_gate": sorted(_name(caller) for caller in callers if caller._fused_route_or_none is gate)}


def _name(caller) -> str:
    return caller.__name__.rsplit(".", 1)[-1]


def callers_asked(callers, device: str = "cpu") -> dict:
    """Each caller's own name for the gate, asked outside any checkpoint and inside a non-reentrant one (a region once
    a router was found): the callers the kernel answered outside, and those told to route eagerly inside."""
    import torch
    import torch.utils.checkpoint

    logits = torch.randn(4, 8, device=device, requires_grad=True)
    outside = [_name(caller) for caller in callers if caller._fused_route_or_none(logits, 2) is not None]
    inside: list = []

    def asked(x):
        inside[:] = [_name(caller) for caller in callers if caller._fused_route_or_none(x, 2) is None]
        return x * 1

    torch.utils.checkpoint.checkpoint(asked, logits, use_reentrant=False).sum().backward()
    return {"callers_fused_outside": sorted(outside), "callers_eager_inside": sorted(inside)}


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fused-router", action="store_true")
    parser.add_argument("--kernel", choices=("stand-in", "release"), default="stand-in")
    parser.add_argument("--block-forwards", action="store_true")
    parser.add_argument("--late", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args(argv)
    cases, fused_router = args.cases, args.fused_router
    state = install(args.late, fused_router, args.block_forwards, args.kernel)
    from hotfix_lab.cases import moe_cases

    for case in cases:
        state["counts"].update(kernel_calls=0, kernel_recomputations=0)
        result = moe_cases.run(case, args.device, args.dtype)
        extra = {key: value for key, value in state.items() if key not in ("counts", "callers")}
        print(json.dumps(dict(result, **state["counts"], **extra)), flush=True)
    if cases and fused_router:  # after the cases: with hotfix a router was found, checkpointed calls are regions
        print(json.dumps(dict(case="callers", **callers_asked(state["callers"], args.device))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
