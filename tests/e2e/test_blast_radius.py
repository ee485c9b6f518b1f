"""hotfix changes only the classes that receive a checkpoint function, never torch's own.

transformers-frozen-inputs used to put its ``_gradient_checkpointing_func`` slot on
``torch.nn.Module``: with hotfix active every module of every process read that attribute
as None instead of raising AttributeError.  Now the slot goes on the class of each module
that holds a checkpoint function (after transformers' enable/setter calls, on unpickling,
and for models set up before activation), and revert takes every one of them away.
"""

from __future__ import annotations

from conftest import hotfix_lines, json_lines, run_child, run_python

ATTRIBUTE = "_gradient_checkpointing_func"


def test_plain_torch_modules_are_untouched_with_hotfix_active():
    """The issue's acceptance line, in a fresh interpreter of the installed wheel."""
    proc = run_python(["-c", "import torch, hotfix; print(hasattr(torch.nn.Linear(1, 1), %r))" % ATTRIBUTE],
                      timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr
    assert hotfix_lines(proc.stderr) == []


def test_slots_sit_exactly_on_the_classes_that_received_a_checkpoint_function():
    proc, seen = run_child(
        """
        import torch, transformers, hotfix
        model, batch = tiny_whisper()
        for name, p in model.named_parameters():  # LoRA-like: only q/v train, no input needs grad
            p.requires_grad_(name.split(".")[-2] in ("q_proj", "v_proj"))
        reference = reference_grads(model, batch)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        holders = {type(m) for m in model.modules() if ATTRIBUTE in m.__dict__}
        def has_slot(cls):
            return type(cls.__dict__.get(ATTRIBUTE)).__name__ == "CheckpointFunctionSlot"
        slotted = {cls for cls in {type(m) for m in model.modules()} if has_slot(cls)}
        result = step(model, batch, reference)
        reverted = hotfix.revert()
        report(
            linear=hasattr(torch.nn.Linear(1, 1), ATTRIBUTE),
            on_module=ATTRIBUTE in torch.nn.Module.__dict__,
            holders=sorted(c.__name__ for c in holders),
            extra_slots=sorted(c.__name__ for c in slotted - holders
                               if c.__name__ != "GradientCheckpointingLayer"),
            missing_slots=sorted(c.__name__ for c in holders - slotted),
            step=result,
            reverted=sorted(reverted),
            left_after_revert=sorted(c.__name__ for c in holders if ATTRIBUTE in c.__dict__),
        )
        """.replace("ATTRIBUTE", repr(ATTRIBUTE)),
    )
    assert seen["linear"] is False and seen["on_module"] is False, seen
    assert seen["holders"] and seen["missing_slots"] == [] and seen["extra_slots"] == [], seen
    assert seen["step"] == {"ok": True, "grads_match": True}, seen
    assert "transformers-frozen-inputs" in seen["reverted"], seen
    assert seen["left_after_revert"] == [], seen  # is-identical revert: the classes hold nothing of hotfix


def test_a_model_set_up_before_activation_is_covered():
    """Checkpointing enabled while hotfix was off (HOTFIX_DISABLE at start-up), then ``import hotfix``
    with the variable gone: the model already holds transformers' function, and its encoder adapters
    get their gradients (opted out of the fix, they get none)."""
    body = """
        import os, torch, transformers
        from hotfix_lab.infra import tiny_models
        model, batch = tiny_models.whisper_qv_only()  # q/v train; enable_input_require_grads() as PEFT's recipe
        reference = reference_grads(model, batch)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        hotfix_before = "hotfix" in sys.modules
        del os.environ["HOTFIX_DISABLE"]
        import hotfix
        report(hotfix_before=hotfix_before, active=hotfix.registry.active, step=step(model, batch, reference),
               missing=sum(p.grad is None for p in model.parameters() if p.requires_grad))
    """
    _, with_fix = run_child(body, env={"HOTFIX_DISABLE": "1"})
    assert with_fix["hotfix_before"] is False and with_fix["active"] is True, with_fix
    assert with_fix["step"] == {"ok": True, "grads_match": True} and with_fix["missing"] == 0, with_fix
    _, opted_out = run_child(body, env={"HOTFIX_DISABLE": "1", "HOTFIX_DISABLED_PATCHES": "transformers-frozen-inputs"})
    assert opted_out["step"]["grads_match"] is False and opted_out["missing"] == 8, opted_out


def test_the_former_name_still_opts_out_with_one_warning():
    """transformers-keyword-tensors was renamed transformers-checkpoint-layer-io: the old name in
    HOTFIX_DISABLED_PATCHES still opts the fix out, and says once that it is the former name."""
    proc = run_python(["-m", "hotfix", "status"], env={"HOTFIX_DISABLED_PATCHES": "transformers-keyword-tensors"},
                      timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "transformers-checkpoint-layer-io: opted out" in proc.stdout
    lines = hotfix_lines(proc.stderr)
    assert len(lines) == 1 and "former name of transformers-checkpoint-layer-io" in lines[0], lines
    assert json_lines(proc.stdout) == []
