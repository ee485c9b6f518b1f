"""Does unsloth's offloading checkpoint run when transformers checkpoints non-reentrantly?

    python zoo_routing.py SETUP [SETUP ...]          one JSON line per setup (and a header line)
    python zoo_routing.py --serve DIR[,DIR ...] SETUP ...   the same per release folder (see serve())

The order of a real unsloth run: transformers is imported, then a real unsloth-zoo release
(on sys.path, loaded on CPU by zoo_loader), then, for the setups after ``swap``, unsloth's own
``patch_unsloth_smart_gradient_checkpointing()`` is called (what ``use_gradient_checkpointing=
"unsloth"`` does; its CUDA buffers stubbed by zoo_loader.cpu_initialize), and only then does the
trainer enable checkpointing on the model (``Trainer`` calls ``gradient_checkpointing_enable``
after ``get_peft_model``).  Unlike the census's zoo_loader.install_unsloth_swap, nothing here
points ``transformers.modeling_utils.checkpoint`` at the release's function: only what the release
itself does.

SETUP (how checkpointing is enabled on a tiny Llama, 3 decoder layers, every parameter trained):

* ``default``:    ``gradient_checkpointing_enable()``: transformers' own default (5.x: non-reentrant)
* ``trl``:        ``gradient_checkpointing_kwargs={"use_reentrant": False}`` (what TRL passes)
* ``reentrant``:  ``gradient_checkpointing_kwargs={"use_reentrant": True}`` (4.x's default, spelled out)
* ``ddp``:        TRL's kwargs, the model in DistributedDataParallel(find_unused_parameters=True), one
  gloo rank on loopback (why people pass use_reentrant=False: "mark a variable ready only once")
* ``swap``:       not a setup: unsloth's request happens here; setups before it are a user who never
  asked for unsloth's offload (with the release imported, as ``import unsloth`` does)
* ``unswap``:     not a setup: torch's and transformers' own checkpoint objects back (unsloth's request undone)
* ``activate``:   not a setup: ``hotfix.activate()`` on the loaded release (started with HOTFIX_DISABLE=1)
* ``revert``:     not a setup: ``hotfix.revert()`` (with hotfix); the setups after it run upstream's code

Per setup, three training steps (no optimizer step: equal gradients expected each time): how many
``UnslothCheckpointFunctionBackward`` nodes each loss hangs on (one per decoder layer = unsloth's
function ran for every checkpointed layer), every gradient against the same step without
checkpointing, whether "Unsloth: Will smartly offload" was printed and how many inputs were sent to
the host in step 1, and which fixes said their "repaired" line.  Offload runs on CPU: upstream's own
branch through fake streams (MINIMUM_SIZE 128), hotfix's offloader on tools/hotfix_lab/infra/simulated_device.py
(threshold 512 B); the layer inputs are 2x16x64 fp32 (8 KiB), so every layer qualifies.  The header
says whether the release's own function offloads at all (``release_offloads``: before 2025.1.1 it
never does; measured where it is still upstream's).

hotfix: HOTFIX_DISABLE=1 in the environment: upstream until ``activate``; otherwise ``import hotfix`` runs
first, as the start-up hook does on ``import transformers``.  Each setup's line says which.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

from hotfix_lab.infra import standalone
from hotfix_lab.infra.zoo_loader import _torch, cpu_initialize, cpu_setup, load_release

LAYERS = 3
UPSTREAM_MINIMUM_SIZE = 128  # elements before 2026.9.8, bytes from then on: 8 KiB inputs exceed both
THRESHOLD_BYTES = 512
ENABLE_KWARGS = {"default": None, "trl": {"use_reentrant": False}, "reentrant": {"use_reentrant": True},
                 "ddp": {"use_reentrant": False}}
OFFLOAD_LINE = "Unsloth: Will smartly offload"
NODE = "UnslothCheckpointFunctionBackward"


def tiny_llama(seed=0):
    torch = _torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).train()
    ids = torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(seed + 1))
    return model, {"input_ids": ids, "labels": ids.clone()}


def count_nodes(tensor, name):
    seen, stack, count = set(), [tensor.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__ == name
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return count


def _offloader():
    """hotfix's offloader where unsloth-zoo-offload-backward is applied (on the simulated device), else None."""
    if "hotfix" not in sys.modules:
        return None
    from hotfix.registry import registry

    patch = registry.patches().get("unsloth-zoo-offload-backward")
    if patch is None or not patch.applied:
        return None
    from hotfix_lab.infra.simulated_device import SimulatedDevice

    patch.offloader.use_device(SimulatedDevice(), threshold_bytes=THRESHOLD_BYTES)
    return patch.offloader


def _said(reset=False):
    """The fixes that said their "repaired" line; ``reset``: forget them first (one line per fix and process
    upstream, here each setup must show its own)."""
    if "hotfix" not in sys.modules:
        return set()
    from hotfix.notice import repair_notice

    if reset:
        repair_notice.said = frozenset()
    return set(repair_notice.said)


def release_offloads(gc):
    """Does the release's own UnslothCheckpointFunction offload at all (before 2025.1.1 it never does)?

    Three chained calls, two passes (2025.1.1 - 2025.11.4 offload only from the second), inputs of
    256 elements / 1 KiB: above UPSTREAM_MINIMUM_SIZE in either unit.
    """
    torch = _torch()
    cpu_initialize(gc, minimum_size=UPSTREAM_MINIMUM_SIZE)
    x = torch.randn(4, 64, requires_grad=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for _ in range(2):
            y = x
            for _ in range(3):
                y = gc.UnslothCheckpointFunction.apply(torch.tanh, True, y)
            y.sum().backward()
    return OFFLOAD_LINE in out.getvalue()


def run_setup(gc, setup, steps=3):
    compare = standalone.load("compare")  # hotfix's gradient rule, without importing hotfix (upstream runs)

    cpu_initialize(gc, minimum_size=UPSTREAM_MINIMUM_SIZE)  # upstream's state: a new run, offload on
    offloader = _offloader()
    said_before = _said(reset=True)
    model, batch = tiny_llama()
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    reference = compare.collect_grads(model)
    result = dict(setup=setup, steps=[])
    try:
        kwargs = ENABLE_KWARGS[setup]
        model.gradient_checkpointing_enable(**({} if kwargs is None else {"gradient_checkpointing_kwargs": kwargs}))
        run = ddp_wrapped(model) if setup == "ddp" else model
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                loss = run(**batch).loss
                offloaded = gc.__dict__.get("CPU_INDEX") if offloader is None else None
                nodes = count_nodes(loss, NODE)
                loss.backward()
            report = compare.compare_grads(reference, compare.collect_grads(model), rtol=1e-6)
            step = dict(unsloth_nodes=nodes, offload_line=OFFLOAD_LINE in out.getvalue(),
                        grads="equal" if report.ok else "differs", summary=report.summary())
            if offloader is not None:
                offloaded = len(offloader.stats.offloaded.get(len(result["steps"]) + 1, []))
            step["offloaded"] = offloaded
            result["steps"].append(step)
    except Exception as exc:  # report it, the other setups still run
        result.update(status="crash", error=compare.short_error(exc))
    result["repaired"] = sorted(_said() - said_before)
    result["layers"] = LAYERS
    return result


def ddp_wrapped(model):
    """``model`` in DistributedDataParallel(find_unused_parameters=True), one gloo rank on loopback: what
    Trainer/TRL set up for PEFT models, the usual reason to pass use_reentrant=False."""
    import socket

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return DistributedDataParallel(model, find_unused_parameters=True)


def request_unsloth_offload(gc):
    """What ``use_gradient_checkpointing="unsloth"`` does: the release's own patch, its CUDA set-up stubbed."""
    with cpu_setup(gc):
        gc.patch_unsloth_smart_gradient_checkpointing()


def _applied():
    from hotfix.registry import registry

    return sorted(name for name, p in registry.patches().items() if p.applied)


def main(argv):
    active = not os.environ.get("HOTFIX_DISABLE")
    if active:
        import hotfix  # noqa: F401  (activates: the start-up hook's moment)
    import torch.utils.checkpoint as tuc
    import transformers
    import transformers.modeling_utils as modeling_utils

    gc = load_release()
    from importlib import metadata

    header = dict(case="header", unsloth_zoo=metadata.version("unsloth-zoo"), transformers=transformers.__version__,
                  torch=_torch().__version__.split("+")[0], hotfix=active,
                  # upstream's own function, measured where it is still upstream's
                  release_offloads=None if active else release_offloads(gc))
    if active:
        header["applied"] = _applied()
    print(json.dumps(header), flush=True)
    # what "never asked" looks like: torch's and transformers' own checkpoint objects
    pristine = (tuc.CheckpointFunction, tuc.checkpoint, modeling_utils.checkpoint)
    requested = False
    for setup in argv:
        if setup == "activate":  # hotfix.activate() on the release already loaded (what the census does)
            os.environ.pop("HOTFIX_DISABLE", None)
            import hotfix

            hotfix.activate()
            active = True
            print(json.dumps(dict(case="activate", applied=_applied())), flush=True)
        elif setup == "revert":  # hotfix.revert(): the setups after it run as upstream does
            import hotfix

            active = False
            print(json.dumps(dict(case="revert", reverted=sorted(hotfix.revert()))), flush=True)
        elif setup == "unswap":  # unsloth's request undone: the objects a user who never asked has
            tuc.CheckpointFunction, tuc.checkpoint, modeling_utils.checkpoint = pristine
            requested = False
        elif setup == "swap":
            request_unsloth_offload(gc)
            requested = True
            print(json.dumps(dict(
                case="swap", checkpoint_function_is_unsloth=tuc.CheckpointFunction is gc.UnslothCheckpointFunction,
                torch_checkpoint=getattr(tuc.checkpoint, "__name__", "?"),
                transformers_checkpoint=getattr(modeling_utils.checkpoint, "__name__", "?"))), flush=True)
        else:
            print(json.dumps(dict(case="setup", requested=requested, hotfix=active, **run_setup(gc, setup))),
                  flush=True)
    return 0


def serve(release_dirs, setups, timeout=600):
    """``main(setups)`` once per release folder, each in a process forked from this one after the heavy
    imports (torch, transformers' Llama): the census measures ~200 releases, and a fresh interpreter
    spends most of its time importing.  Nothing of hotfix or unsloth-zoo is imported before the fork;
    each child puts its release first on sys.path.  Every JSON line a child prints is printed again with
    ``zoo_dir`` added; a child that dies or overruns ``timeout`` gets an ``error`` line."""
    import signal

    import transformers.modeling_utils  # noqa: F401  (what every child would import first)
    import transformers.models.llama.modeling_llama  # noqa: F401

    for directory in release_dirs:
        sys.stdout.flush()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its stdout is the pipe
            os.close(read_end)
            os.dup2(write_end, 1)
            signal.alarm(int(timeout))
            sys.path.insert(0, directory)
            code = 1
            try:
                code = main(setups)
            except BaseException:  # noqa: BLE001  (said on stderr; the parent reports the exit)
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                os._exit(code)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            output = pipe.read()
        _, status = os.waitpid(pid, 0)
        for line in output.splitlines():
            if line.startswith("{"):
                print(json.dumps(dict(json.loads(line), zoo_dir=directory)), flush=True)
        if status:
            print(json.dumps(dict(case="error", zoo_dir=directory, error=f"child exit status {status}")), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:  # --serve DIR[,DIR...] SETUP...
        sys.exit(serve(sys.argv[2].split(","), sys.argv[3:]))
    sys.exit(main(sys.argv[1:]))
