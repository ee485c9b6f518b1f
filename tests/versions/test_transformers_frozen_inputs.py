"""patches/transformers_frozen_inputs.py across the transformers release matrix.

Whisper fine-tuned on q_proj/v_proj only (PEFT LoRA, or the same thing without
peft: everything else frozen), after enable_input_require_grads(), one step
with reentrant checkpointing against one step without checkpointing
(hotfix.diagnostics.compare, 1e-6 relative).  Each release runs in two fresh
interpreters: with this patch opted out (HOTFIX_DISABLED_PATCHES; the other
patches stay active so only this fix is measured) and with hotfix as installed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from packaging.version import Version

from conftest import TRANSFORMERS_WARM, json_lines, matrix_path, matrix_versions, run_python

PATCH = "transformers-frozen-inputs"
AFFECTED_BELOW = Version("5.0.0")

# Measured upstream (torch 2.13.0 CPU): on every 4.x release of the matrix the
# encoder's 8 q/v tensors (2 layers x q,v x weight,bias or LoRA A,B) get no
# gradient; 5.x hooks the encoder's conv1 in enable_input_require_grads().
MISSING_UPSTREAM = {"4.52.4": 8, "4.53.3": 8, "4.56.2": 8, "4.57.6": 8, "5.0.0": 0, "5.23.0": 0,
                    "5.24.0": 0}  # 5.24.0: measured 2026-11-29

# One child interpreter: every case given on the command line, one JSON line each.
CHILD = r"""
import hashlib, json, sys
import torch, transformers
import hotfix
from hotfix_lab.infra import tiny_models
from hotfix.diagnostics.compare import collect_grads, compare_grads

def digest(loss, grads):
    h = hashlib.sha256(repr(loss).encode())
    for name in sorted(grads):
        g = grads[name]
        h.update(name.encode() + (b"none" if g is None else g.numpy().tobytes()))
    return h.hexdigest()

patch = next(p for p in hotfix.known_patches().values() if p.name == "transformers-frozen-inputs")
for case in sys.argv[1:]:
    out = {"case": case, "transformers": transformers.__version__}
    if case == "--revert":  # checkpointing enabled with hotfix, then hotfix undone
        model, batch = tiny_models.whisper_qv_only()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        layer = model.model.encoder.layers[0]
        stored = layer.__dict__["_gradient_checkpointing_func"]
        # the slot sits on the classes that received a checkpoint function, never on torch.nn.Module
        out.update(before=type(type(layer).__dict__.get("_gradient_checkpointing_func")).__name__,
                   on_module="_gradient_checkpointing_func" in torch.nn.Module.__dict__,
                   stored_is_plain=type(stored).__name__ == "partial")
        out.update(reverted=hotfix.revert())
        out.update(restored="_gradient_checkpointing_func" not in type(layer).__dict__
                   and layer._gradient_checkpointing_func is stored)
        model.zero_grad(set_to_none=True); model(**batch).loss.backward()
        out.update(missing=sum(p.grad is None for p in model.parameters() if p.requires_grad))
        print(json.dumps(out), flush=True)
        continue
    try:
        model, batch = tiny_models.BUILDERS[case]()
        out["applied"] = patch.applied  # modeling_utils (the target) is imported by now
    except ImportError as exc:
        print(json.dumps(dict(out, status="n/a", error=repr(exc))), flush=True)
        continue
    model.zero_grad(set_to_none=True); model(**batch).loss.backward()
    reference = collect_grads(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.zero_grad(set_to_none=True)
    try:
        loss = model(**batch).loss
        loss.backward()
    except Exception as exc:
        print(json.dumps(dict(out, status="crash", error=f"{type(exc).__name__}: {exc}"[:200])), flush=True)
        continue
    grads = collect_grads(model)
    report = compare_grads(reference, grads, rtol=1e-6)
    out.update(status="equal" if report.ok else "differs", summary=report.summary(), missing=len(report.missing),
               wrong=len(report.wrong), total=report.total, max_error=report.max_error,
               loss=float(loss), digest=digest(float(loss), grads))
    print(json.dumps(out), flush=True)
"""

# whisper-qv-only is the LoRA situation without peft and runs everywhere; the
# PEFT case (peft is not part of scripts/test.sh: n/a where missing), the
# nothing-frozen case and the revert check run on one affected release only,
# to keep the file fast on a small shared CPU.
FULL_VERSION = "4.56.2"


def _cases(version, enabled):
    if version != FULL_VERSION:
        return ["whisper-qv-only", "whisper-qv-no-hook"]
    return ["whisper-qv-only", "whisper-qv-no-hook", "whisper-lora", "whisper"] + (["--revert"] if enabled else [])


def _run(version, enabled):
    cases = _cases(version, enabled)
    env = {"OMP_NUM_THREADS": "1"}  # tiny tensors: threads only contend on a small shared CPU
    if not enabled:
        env["HOTFIX_DISABLED_PATCHES"] = PATCH
    proc = run_python(["-c", CHILD, *cases], env=env, pythonpath=[matrix_path("transformers", version)],
                      timeout=300, warm=TRANSFORMERS_WARM)
    results = {r["case"]: r for r in json_lines(proc.stdout)}
    assert set(results) == set(cases), proc.stderr[-3000:]
    return results


def _adapter_results(results):
    return [results[c] for c in ("whisper-qv-only", "whisper-lora") if c in results and results[c]["status"] != "n/a"]


@pytest.mark.parametrize("version", matrix_versions("transformers"))
def test_frozen_inputs_gradients(version):
    """Broken upstream where measured; with hotfix every trainable parameter gets its gradient.

    On 5.x (after enable_input_require_grads) the patch has nothing to do and the
    step is bit-identical to upstream; without that call 5.x crashes like 4.x.
    """
    affected = Version(version) < AFFECTED_BELOW
    # The two fresh interpreters (patch opted out / hotfix as installed) run side by side.
    with ThreadPoolExecutor(2) as pool:
        without, with_patch = pool.map(lambda enabled: _run(version, enabled), (False, True))

    for result in _adapter_results(without):
        assert not result["applied"], result
        assert result["missing"] == MISSING_UPSTREAM[version], result
        assert (result["status"] == "equal") == (not affected), result
        if affected:
            assert ".encoder.layers." in result["summary"], result

    for result in _adapter_results(with_patch):
        assert result["applied"] is True, result  # gated on the mechanism, 5.x included
        assert result["status"] == "equal", result
        assert result["missing"] == 0 and result["wrong"] == 0 and result["max_error"] <= 1e-6, result
        assert result["total"] == 24, result
        if not affected:  # 5.x hooks every sub-model: no call lacks a grad input, the step is upstream's
            assert result["digest"] == without[result["case"]]["digest"], result

    # No enable_input_require_grads() (issue 11's script): no layer input needs grad,
    # so upstream's loss has no graph on every release; with hotfix every gradient arrives.
    no_hook_without, no_hook_with = without["whisper-qv-no-hook"], with_patch["whisper-qv-no-hook"]
    assert no_hook_without["status"] == "crash" and "does not require grad" in no_hook_without["error"], no_hook_without
    assert no_hook_with["status"] == "equal" and no_hook_with["total"] == 24, no_hook_with

    if version == FULL_VERSION:
        # Nothing frozen: the patch changes nothing (same loss, bit-identical gradients).
        plain_without, plain_with = without["whisper"], with_patch["whisper"]
        assert plain_without["status"] == plain_with["status"] == "equal", (plain_without, plain_with)
        assert plain_with["loss"] == plain_without["loss"]
        assert plain_with["digest"] == plain_without["digest"]
        # The model stores transformers' own function; hotfix.revert() removes the
        # class-level slot, so the same model is upstream again: 8 missing.
        revert = with_patch["--revert"]
        assert revert["before"] == "CheckpointFunctionSlot" and revert["stored_is_plain"], revert
        assert revert["on_module"] is False, revert
        assert PATCH in revert["reverted"] and revert["restored"], revert
        assert revert["missing"] == 8, revert
