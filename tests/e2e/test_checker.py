"""hotfix.checker / `hotfix check-model`: finds silent gradient loss, restores the model, guards memory.

Acceptance (transformers 4.56.2, the test venv's own release): with
HOTFIX_DISABLE=1 the checker reports each failure of the issue (LayoutLM and
Whisper with frozen decoder embeddings: missing gradients; Whisper + PEFT LoRA
on q/v: the encoder's LoRA weights missing; WavLM: runaway memory caught by the
guard), and with hotfix active every parameter gradient is equal.  Each case
runs in a fresh interpreter (the opt-out must act before transformers loads).

The builders below are importable by the child as ``test_checker:<name>``
(tests/ is on the child's PYTHONPATH), which is also how a user points
``hotfix check-model`` at their own factory.
"""

from __future__ import annotations

from pathlib import Path

import json

import pytest
import torch
from torch import nn

from conftest import json_lines
from conftest import run_python as _run_python

HERE = Path(__file__).resolve().parent


def run_python(args, **kwargs):
    """conftest.run_python with this folder importable: the children and check-model targets use its builders."""
    kwargs["pythonpath"] = [*kwargs.get("pythonpath", ()), HERE]
    return _run_python(args, **kwargs)


# -- factories for the child interpreters (model, batch) ----------------------------


def layoutlm():
    from hotfix_lab.infra import tiny_models

    return tiny_models.layoutlm()


def whisper_frozen_decoder_embeddings():
    from hotfix_lab.infra import tiny_models

    return tiny_models.whisper_frozen()


def whisper_lora():
    """Whisper + PEFT LoRA on q/v, enable_input_require_grads(), as in a typical PEFT recipe.

    init_lora_weights=False gives lora_B non-zero values, so lora_A gradients
    are non-zero too (with PEFT's default B=0 they are exactly zero at step 0
    and only the lora_B ones can be missing).
    """
    from hotfix_lab.infra import tiny_models
    from peft import LoraConfig, get_peft_model

    model, batch = tiny_models.whisper()
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             lora_dropout=0.0, init_lora_weights=False))
    model.enable_input_require_grads()
    model.train()
    return model, batch


class _OneLayer(nn.Module):
    """The smallest model check-model accepts: one checkpointable layer, transformers' switch names."""

    supports_gradient_checkpointing = True

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gradient_checkpointing = False
        self.calls = 0

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        import functools

        from torch.utils.checkpoint import checkpoint

        self._gradient_checkpointing_func = functools.partial(checkpoint, **(gradient_checkpointing_kwargs or {}))
        self.gradient_checkpointing = True

    def gradient_checkpointing_disable(self):
        self.gradient_checkpointing = False

    def layer(self, x):
        return torch.tanh(self.lin(x))

    def forward(self, x):
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(self.layer, x)
        return self.layer(x)


class _HangsWhenCheckpointing(_OneLayer):
    def layer(self, x):
        import time

        if self.gradient_checkpointing:
            time.sleep(120)  # one long call: no hook between, so only the hard exit can end it
        return super().layer(x)


class _StatefulLayer(_OneLayer):
    def layer(self, x):
        self.calls += 1  # the recomputation differs from the forward: wrong with or without hotfix
        return super().layer(x) * self.calls


def hangs_when_checkpointing():
    return _HangsWhenCheckpointing().train(), {"x": torch.randn(2, 4, requires_grad=True)}


def stateful_layer():
    return _StatefulLayer().train(), {"x": torch.randn(2, 4, requires_grad=True)}


def wavlm():
    from hotfix_lab.infra import tiny_models

    return tiny_models.wavlm()


def whisper_lora_default_init():
    """PEFT's defaults (lora_B = 0: every lora_A gradient is exactly zero at step 0),
    no enable_input_require_grads(): the issue-12 reproduction."""
    from hotfix_lab.infra import tiny_models
    from peft import LoraConfig, get_peft_model

    model, batch = tiny_models.whisper()
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             lora_dropout=0.0))
    return model.train(), batch


_CHILD = r"""
import json, sys
import test_checker
from hotfix.diagnostics import check_model
for spec in sys.argv[1:]:
    name, modes, limit = spec.split(":")
    model, batch = getattr(test_checker, name)()
    report = check_model(model, batch, modes=modes.split(","), memory_limit=int(limit) << 20, time_limit=90,
                         hard_exit=True, grace=30)
    data = report.to_dict()
    data["case"] = name
    print(json.dumps(data), flush=True)
"""

# name -> (modes checked, memory limit MiB).  WavLM unpatched grows ~15 MB/s
# here: 256 MiB trips the guard in well under a minute; the default mode on
# 4.56 is the same reentrant function, so only the explicit modes run.
CASES = {
    "layoutlm": ("reentrant,non-reentrant,default", 1024),
    "whisper_frozen_decoder_embeddings": ("reentrant,non-reentrant,default", 1024),
    "whisper_lora": ("reentrant,non-reentrant,default", 1024),
    "wavlm": ("reentrant,non-reentrant", 256),
}


def _run(disabled: bool):
    args = ["-c", _CHILD] + [f"{name}:{modes}:{limit}" for name, (modes, limit) in CASES.items()]
    proc = run_python(args, env={"HOTFIX_DISABLE": "1"} if disabled else None, timeout=600)
    results = {r["case"]: r for r in json_lines(proc.stdout)}
    assert set(results) == set(CASES), proc.stderr[-3000:]
    return results


@pytest.fixture(scope="module")
def unpatched():
    pytest.importorskip("peft")
    return _run(disabled=True)


@pytest.fixture(scope="module")
def patched():
    pytest.importorskip("peft")
    return _run(disabled=False)


def _mode(result, name):
    return next(m for m in result["modes"] if m["mode"] == name)


def test_unpatched_layoutlm_missing_gradients(unpatched):
    r = unpatched["layoutlm"]
    assert not r["hotfix_active"] and r["versions"]["transformers"] == "4.56.2"
    assert not r["safe"]
    re = _mode(r, "reentrant")
    assert re["status"] == "wrong" and len(re["missing"]) == 41 and re["total"] == 45, re["summary"]
    assert _mode(r, "non-reentrant")["status"] == "equal"
    assert _mode(r, "default")["status"] == "wrong"  # 4.56 defaults to reentrant
    assert "use_reentrant=True" in _mode(r, "default")["checkpoint_function"]


def test_unpatched_whisper_frozen_embeddings_missing_gradients(unpatched):
    r = unpatched["whisper_frozen_decoder_embeddings"]
    re = _mode(r, "reentrant")
    assert re["status"] == "wrong" and len(re["missing"]) == 84 and re["total"] == 86, re["summary"]
    assert not r["safe"] and _mode(r, "non-reentrant")["status"] == "equal"


def test_unpatched_whisper_lora_encoder_weights_missing(unpatched):
    r = unpatched["whisper_lora"]
    re = _mode(r, "reentrant")
    assert re["status"] == "wrong" and re["total"] == 24, re["summary"]
    assert len(re["missing"]) == 8 and all(".encoder." in n and "lora_" in n for n in re["missing"]), re["missing"]
    assert not r["safe"] and _mode(r, "non-reentrant")["status"] == "equal"


def test_unpatched_wavlm_runaway_memory_is_caught(unpatched):
    r = unpatched["wavlm"]
    re = _mode(r, "reentrant")
    assert re["status"] == "guard" and "memory guard" in re["error"], re
    assert not r["safe"] and _mode(r, "non-reentrant")["status"] == "equal"


@pytest.mark.parametrize("case", [
    "layoutlm",
    "whisper_frozen_decoder_embeddings",
    "whisper_lora",  # fixed by transformers-frozen-inputs
    "wavlm",
])
def test_patched_all_gradients_equal(patched, case):
    r = patched[case]
    assert r["hotfix_active"]
    for m in r["modes"]:
        assert m["status"] == "equal" and m["equal"] == m["total"], (m["mode"], m["summary"])
    assert r["safe"]


def test_cli_exit_status_and_compare_hotfix():
    """`hotfix check-model MODULE:CALLABLE`: 1 unsafe, 0 safe; --compare-hotfix runs both."""
    proc = run_python(["-m", "hotfix", "check-model", "hotfix_lab.infra.tiny_models:layoutlm", "--modes", "reentrant",
                       "--compare-hotfix", "--json"], timeout=300)
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    without, with_fix = data["without hotfix (HOTFIX_DISABLE=1)"], data["with hotfix"]
    assert without["exit_status"] == 1 and not without["safe"], without
    assert with_fix["exit_status"] == 0 and with_fix["safe"], with_fix
    assert proc.returncode == 0
    text = run_python(["-m", "hotfix", "check-model", "hotfix_lab.infra.tiny_models:layoutlm", "--modes", "non-reentrant"],
                      timeout=300)
    assert text.returncode == 0 and "verdict: SAFE" in text.stdout, text.stdout + text.stderr[-2000:]
    bad = run_python(["-m", "hotfix", "check-model", "no_such_module:build"], timeout=120)
    assert bad.returncode == 2 and "could not build" in bad.stderr
    both_bad = run_python(["-m", "hotfix", "check-model", "no_such_module:build", "--compare-hotfix"], timeout=120)
    assert both_bad.returncode == 2, both_bad.stdout + both_bad.stderr  # the with-hotfix half decides


def test_exit_status_3_when_a_step_overruns_and_does_not_stop():
    """A step past --time-limit that does not return within --grace: the process ends itself with
    status 3 and says why (the OOM killer would give no reason); --compare-hotfix passes it on."""
    args = ["-m", "hotfix", "check-model", "test_checker:hangs_when_checkpointing", "--modes", "reentrant",
            "--time-limit", "1", "--grace", "1"]
    proc = run_python(args, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "time guard: the reentrant step ran over 1 s" in proc.stderr and "exiting with status 3" in proc.stderr
    both = run_python(args + ["--compare-hotfix", "--json"], timeout=120)
    assert both.returncode == 3, both.stdout + both.stderr
    data = json.loads(both.stdout.strip().splitlines()[-1])
    assert [half["exit_status"] for half in data.values()] == [3, 3], data


def test_compare_hotfix_exit_status_is_the_with_hotfix_half():
    """Unsafe with hotfix too (a layer whose recomputation differs): --compare-hotfix exits 1, and the
    half without hotfix is reported beside it."""
    proc = run_python(["-m", "hotfix", "check-model", "test_checker:stateful_layer", "--modes", "reentrant",
                       "--compare-hotfix", "--json"], timeout=120)
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    without, with_fix = data["without hotfix (HOTFIX_DISABLE=1)"], data["with hotfix"]
    assert proc.returncode == 1 and with_fix["exit_status"] == 1 and not with_fix["safe"], data
    assert without["exit_status"] == 1 and _mode(with_fix, "reentrant")["status"] == "wrong", data


def test_no_gradient_is_never_equal_to_a_zero_gradient_and_the_loss_is_the_models():
    """Issue 12's reproduction, without hotfix: checkpointing cut the loss off the
    graph, so none of the 24 LoRA tensors gets a gradient, including the 12 lora_A
    whose reference gradient is exactly zero; the reported loss is the model's own."""
    pytest.importorskip("peft")
    args = ["-m", "hotfix", "check-model", "test_checker:whisper_lora_default_init", "--modes", "reentrant", "--json"]
    without = run_python(args, env={"HOTFIX_DISABLE": "1"}, timeout=300)
    data = json.loads(without.stdout.strip().splitlines()[-1])
    mode = _mode(data, "reentrant")
    assert without.returncode == 1 and data["safe"] is False, data
    assert mode["equal"] == 0 and len(mode["missing"]) == 24 and mode["total"] == 24, mode
    assert mode["graph_cut"] is True and mode["saved_bytes"] == 0, mode
    assert mode["loss"] == pytest.approx(data["reference"]["loss"], rel=1e-6), (mode, data["reference"])
    assert mode["loss_source"] == data["reference"]["loss_source"] == "model"
    with_hotfix = run_python(args, timeout=300)
    fixed = json.loads(with_hotfix.stdout.strip().splitlines()[-1])
    assert with_hotfix.returncode == 0 and _mode(fixed, "reentrant")["equal"] == 24, fixed


class _UnusedHead(_OneLayer):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 4)  # trainable, never called: no gradient with or without checkpointing


def test_parameters_without_a_reference_gradient_are_named_not_hidden_in_equal():
    """None == None counts as equal (checkpointing changed nothing for them), but the report names the
    trainable parameters that get no gradient even without checkpointing, so "all equal" cannot pass
    off a check that compared nothing (the sweep turns a LoRA recipe whose adapters never run into n/a)."""
    from hotfix.diagnostics import check_model

    model = _UnusedHead().train()
    report = check_model(model, {"x": torch.randn(2, 4, requires_grad=True)}, modes=("reentrant",))
    assert report.safe and report.mode("reentrant").equal == 4, report.format()
    assert report.without_gradient == ["head.weight", "head.bias"]
    assert report.to_dict()["without_gradient"] == ["head.weight", "head.bias"]
    assert "2 of 4 trainable parameters get no gradient even without checkpointing (e.g. head.weight)" in report.format()
