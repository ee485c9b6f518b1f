"""Cases run on a real unsloth-zoo release loaded on CPU by zoo_loader.py.

    python zoo_cases.py [--late] CASE [CASE ...] [--activate CASE ...]
                                                         one JSON line per case

hotfix: by default ``import hotfix`` runs first (activation, as the .pth
start-up hook would on ``import unsloth``), so the patches arrive through
post-import hooks.  ``--late`` first loads the release *and* installs
unsloth's swap of torch's CheckpointFunction, then imports hotfix: the hooks
must then fire at once on the already-imported module.  HOTFIX_DISABLE=1 in
the environment gives upstream behaviour.

Cases: whisper, whisper-frozen, closure, frozen, offload, status, drift
(drift replaces the whole module by a fake one and must run alone).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import sys
import types

from hotfix_lab.infra.zoo_loader import TARGET, _torch, cpu_initialize, install_stubs, install_unsloth_swap, load_release, zoo_dir


def _count_nodes(tensor, name):
    seen, stack, count = set(), [tensor.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == name:
            count += 1
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return count


def _compare(reference, candidate):
    from hotfix.diagnostics.compare import compare_grads

    report = compare_grads(reference, candidate, rtol=1e-6)
    return dict(status="equal" if report.ok else "differs", summary=report.summary(),
                max_error=report.max_error, missing=len(report.missing), wrong=len(report.wrong))


def case_whisper(gc, builder="whisper"):
    """A tiny model (tiny_models.BUILDERS) through hotfix's comparison engine, reentrant: what unsloth's
    swap replaces, and what unsloth-zoo forces on transformers 5.x (use_reentrant=True)."""
    from hotfix_lab.cases import grad_case
    from hotfix_lab.infra import tiny_models
    from hotfix.diagnostics.checker import check_model

    model, batch = tiny_models.BUILDERS[builder]()
    nodes = []

    def loss_with_node_count(output, batch):
        nodes.append(_count_nodes(output.loss, "UnslothCheckpointFunctionBackward"))
        return output.loss

    report = check_model(model, batch, loss_fn=loss_with_node_count, modes=["reentrant"], rtol=1e-6, cut="raise")
    result = grad_case.case_result(report, {})
    result.pop("total", None), result.pop("loss", None)
    return dict(result, unsloth_nodes=nodes[-1] if len(nodes) > 1 else 0)


class _Layer(_torch().nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin = _torch().nn.Linear(d, d)

    def forward(self, hidden, encoder_hidden_states=None):
        return hidden + _torch().tanh(self.lin(hidden) + encoder_hidden_states.mean(0))


def case_closure(gc):
    """Direct apply(partial(layer, encoder_hidden_states=enc), True, h), two layers share enc."""
    torch = _torch()
    from hotfix.diagnostics.compare import collect_grads

    torch.manual_seed(0)
    model = torch.nn.ModuleDict(dict(enc=torch.nn.Linear(8, 8), l1=_Layer(), l2=_Layer()))
    x, h0 = torch.randn(3, 8), torch.randn(4, 8)

    def run(checkpointed):
        model.zero_grad(set_to_none=True)
        h = h0.clone().requires_grad_(True)
        enc = model["enc"](x)
        for name in ("l1", "l2"):
            layer = model[name]
            if checkpointed:
                h = gc.UnslothCheckpointFunction.apply(functools.partial(layer, encoder_hidden_states=enc), True, h)
            else:
                h = layer(h, encoder_hidden_states=enc)
        h.sum().backward()
        return collect_grads(model)

    reference = run(False)
    try:
        candidate = run(True)
    except Exception as exc:
        from hotfix.diagnostics.compare import short_error
        return dict(status="crash", error=short_error(exc))
    return _compare(reference, candidate)


def case_frozen(gc):
    """apply(fn, True, h_frozen, w): args[0] needs no grad, w does."""
    torch = _torch()
    torch.manual_seed(0)
    h0 = torch.randn(4, 8)
    w = torch.randn(4, 8, requires_grad=True)
    try:
        gc.UnslothCheckpointFunction.apply(lambda a, b: a * b + b, True, h0, w).sum().backward()
    except Exception as exc:
        from hotfix.diagnostics.compare import short_error
        return dict(status="crash", error=short_error(exc))
    return dict(status="equal" if w.grad is not None and torch.equal(w.grad, h0 + 1) else "differs")


SMALL, BIG = 8, 64  # layer 1's input is 4x8 fp32 = 128 B, the others 4x64 = 1 KiB
THRESHOLD_BYTES = 512


def case_offload(gc, hotfix_offload):
    """4 checkpointed layers x 3 steps; which inputs go to the host, per step.

    With hotfix's patch applied its offloader runs on tools/hotfix_lab/infra/simulated_device.py's SimulatedDevice
    (threshold 512 B); otherwise upstream's own offload branch runs CPU->CPU through
    fake streams (MINIMUM_SIZE 128 elements = 512 B of fp32).
    """
    torch = _torch()
    from hotfix.diagnostics.compare import collect_grads

    device = None
    if hotfix_offload is not None:
        from hotfix_lab.infra.simulated_device import SimulatedDevice

        device = SimulatedDevice()
        hotfix_offload.use_device(device, threshold_bytes=THRESHOLD_BYTES)
    else:
        # MINIMUM_SIZE counts elements before 2026.9.8 and bytes from then on;
        # 128 splits our inputs the same way in both units (32 el./128 B is
        # kept, 256 el./1 KiB is offloaded), like THRESHOLD_BYTES does for hotfix.
        cpu_initialize(gc, minimum_size=128)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(SMALL, BIG), *[torch.nn.Linear(BIG, BIG) for _ in range(3)])
    result = dict(steps=[])
    for step in range(3):
        x = torch.randn(4, SMALL, generator=torch.Generator().manual_seed(step))

        def run(checkpointed):
            model.zero_grad(set_to_none=True)
            h = x.clone().requires_grad_(True)
            for layer in model:
                fn = lambda t, layer=layer: torch.tanh(layer(t))  # noqa: E731
                h = gc.UnslothCheckpointFunction.apply(fn, True, h) if checkpointed else fn(h)
            h.sum().backward()
            return collect_grads(model)

        reference = run(False)
        out = io.StringIO()
        if hotfix_offload is None:
            gc.CPU_INDEX = 0
        allocations_before = device.allocations("host") if device is not None else None
        with contextlib.redirect_stdout(out):
            candidate = run(True)
        entry = dict(_compare(reference, candidate), messages=out.getvalue().count("Unsloth: Will smartly offload"),
                     printed=out.getvalue())
        if hotfix_offload is not None:
            entry["offloaded"] = hotfix_offload.stats.offloaded.get(step + 1, [])
            entry["new_host_allocations"] = device.allocations("host") - allocations_before
        else:
            entry["offloaded_count"] = gc.CPU_INDEX
        result["steps"].append(entry)
    if device is not None:
        result["log"] = device.log
        result["reloads"] = hotfix_offload.stats.reloads
    return result


def case_revert(gc):
    """hotfix.revert() puts upstream's own methods back: its frozen-first-input crash returns."""
    import hotfix

    reverted = hotfix.revert()
    cls = gc.UnslothCheckpointFunction
    own = {name: getattr(cls.__dict__.get(name), "__func__", None) for name in ("forward", "backward")}
    return dict(
        status="ok", reverted=sorted(reverted), apply_wrapped="apply" in cls.__dict__,
        methods_from_release=all(f is not None and f.__module__ == TARGET and f.__qualname__.startswith(
            "UnslothCheckpointFunction.") for f in own.values()),
        frozen_after_revert=case_frozen(gc)["status"],
    )


def case_status(gc):
    from hotfix.cli import status

    out = io.StringIO()
    status(out=out, verbose=True)
    return dict(status="ok", text=out.getvalue())


def case_drift():
    """A release whose UnslothCheckpointFunction lost what the patches rely on."""
    import logging

    torch = _torch()
    install_stubs(zoo_dir())
    fake = types.ModuleType(TARGET)

    class UnslothCheckpointFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, run_function, *args):  # preserve_rng_state gone
            ctx.run_function = run_function
            return run_function(*args)

        @staticmethod
        def backward(ctx, grad):
            return None, grad * 2

    fake.UnslothCheckpointFunction = UnslothCheckpointFunction
    sys.modules[TARGET] = fake
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("hotfix").addHandler(handler)
    from hotfix.registry import registry

    # registry.patches(), not hotfix.patches(): once a patch module is loaded the
    # hotfix.patches subpackage shadows that function on the package.
    patches = registry.patches()
    x = torch.ones(2, requires_grad=True)
    UnslothCheckpointFunction.apply(lambda t: t * 2, x).sum().backward()
    return dict(
        status="ok",
        warnings=[r.getMessage() for r in records if r.levelno >= logging.WARNING],
        applied={name: p.applied for name, p in patches.items() if name.startswith("unsloth-zoo")},
        errors={name: p.last_error for name, p in patches.items() if name.startswith("unsloth-zoo")},
        grad=x.grad.tolist(),
        apply_is_inherited="apply" not in UnslothCheckpointFunction.__dict__,
    )


def _header(gc, phase, hotfix_before):
    from importlib import metadata

    import torch.utils.checkpoint as tuc
    from hotfix.registry import registry

    # registry.patches(), not hotfix.patches(): once a patch module is loaded the
    # hotfix.patches subpackage shadows that function on the package.
    patches = registry.patches()
    print(json.dumps(dict(
        case="header", phase=phase, version=metadata.version("unsloth-zoo"), hotfix_active=registry.active,
        hotfix_imported_before_release=hotfix_before,
        applied={name: p.applied for name, p in patches.items()},
        apply_wrapped="apply" in gc.UnslothCheckpointFunction.__dict__,
        checkpoint_function_is_unsloth=tuc.CheckpointFunction is gc.UnslothCheckpointFunction,
    )), flush=True)
    offload_patch = patches.get("unsloth-zoo-offload-backward")
    return offload_patch.offloader if offload_patch is not None and offload_patch.applied else None


def _run_cases(gc, cases, phase, offloader):
    runners = {
        "whisper": lambda: case_whisper(gc),
        "whisper-frozen": lambda: case_whisper(gc, "whisper-frozen-decoder-embeddings"),
        # adapters on q/v, no enable_input_require_grads(): no layer input needs grad
        "whisper-qv-no-hook": lambda: case_whisper(gc, "whisper-qv-no-hook"),
        "whisper-lora-no-hook": lambda: case_whisper(gc, "whisper-lora-no-hook"),
        "pvt-v2": lambda: case_whisper(gc, "pvt-v2"),  # nested outputs
        "closure": lambda: case_closure(gc),
        "frozen": lambda: case_frozen(gc),
        "offload": lambda: case_offload(gc, offloader),
        "status": lambda: case_status(gc),
        "revert": lambda: case_revert(gc),
    }
    for name in cases:
        try:
            if name != "offload":
                cpu_initialize(gc)  # upstream state back to "never offload" (an earlier case may have changed it)
            result = runners[name]()
        except Exception as exc:  # report, do not hide the other cases
            from hotfix.diagnostics.compare import short_error
            result = dict(status="crash", error=short_error(exc))
        print(json.dumps(dict(case=name, phase=phase, **result)), flush=True)


def main(argv):
    """[--late] CASE... [--activate CASE...]

    --activate: the cases before it run as the process started (HOTFIX_DISABLE=1:
    upstream behaviour), then HOTFIX_DISABLE is dropped and hotfix.activate()
    is called on the already-loaded release, and the cases after it run again.
    """
    if argv == ["drift"]:
        print(json.dumps(dict(case="drift", **case_drift())), flush=True)
        return 0
    late = "--late" in argv
    argv = [a for a in argv if a != "--late"]
    first, then = (argv[: argv.index("--activate")], argv[argv.index("--activate") + 1:]) \
        if "--activate" in argv else (argv, None)
    if not late:
        import hotfix  # noqa: F401  (activates, unless HOTFIX_DISABLE)
    hotfix_before = "hotfix" in sys.modules
    gc = load_release()
    install_unsloth_swap(gc)
    if late:
        assert "hotfix" not in sys.modules
        import hotfix  # noqa: F401  (activates now: hooks must fire on the loaded module)
    phase = "upstream" if os.environ.get("HOTFIX_DISABLE") else "hotfix"
    _run_cases(gc, first, phase, _header(gc, phase, hotfix_before))
    if then is not None:
        import hotfix

        os.environ.pop("HOTFIX_DISABLE", None)
        assert hotfix.activate()
        _run_cases(gc, then, "hotfix", _header(gc, "hotfix", hotfix_before))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
