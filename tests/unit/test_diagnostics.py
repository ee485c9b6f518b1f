"""In-process unit tests of the diagnostics: the comparison engine, its one-line errors, the
child-process environment, check-model's modes and result accounting, the memory helpers.

Seconds, no child interpreter: the same engine is what check-model, doctor, the tests,
the sweep and the benchmarks use, so its rules are pinned here once.
"""

from __future__ import annotations

import time

import pytest
import torch

from hotfix.config import DISABLE_VAR
from hotfix.diagnostics import modes
from hotfix.diagnostics.children import child_env, json_lines, last_line
from hotfix.diagnostics.compare import GradReport, compare_grads, short_error, tolerance_for
from hotfix.diagnostics.guard import GuardTripped, Watchdog
from hotfix.diagnostics.memory import fmt_bytes, parse_bytes
from hotfix.diagnostics.results import ModeResult


# --------------------------------------------------------------------------- compare_grads
def test_none_is_never_equal_to_a_zero_gradient():
    reference = {"a": torch.zeros(3), "b": None, "c": torch.ones(2)}
    report = compare_grads(reference, {"a": None, "b": torch.zeros(1), "c": torch.ones(2)})
    assert report.missing == ["a"]  # reference zero, candidate None: an optimizer skips it
    assert report.unexpected == ["b"]  # reference None, candidate zero
    assert report.equal == ["c"]
    assert not report.ok and report.total == 3
    assert report.state("a") == "missing" and report.state("b") == "unexpected" and report.state("c") == "equal"


def test_a_nan_gradient_is_wrong_and_infinitely_so():
    """Found with the stream sanitizer's poisoned buffers: NaN compared false everywhere, so the report
    said "max rel. error 0.0e+00" next to 85 wrong gradients."""
    report = compare_grads({"a": torch.ones(3), "b": torch.ones(2)}, {"a": torch.full((3,), float("nan")),
                                                                    "b": torch.ones(2)})
    assert [name for name, _ in report.wrong] == ["a"] and report.equal == ["b"]
    assert report.max_error == float("inf") and "inf" in report.summary()


def test_none_equals_none_and_a_name_absent_from_the_candidate_is_missing():
    report = compare_grads({"frozen": None, "w": torch.ones(2)}, {"frozen": None})
    assert report.equal == ["frozen"] and report.missing == ["w"]


def test_one_tolerance_rule_relative_to_the_larger_of_own_and_floor_times_model_norm():
    big = torch.full((100,), 10.0)
    noise = torch.tensor([1e-9])  # a gradient that is zero in exact arithmetic, only rounding noise
    reference = {"big": big, "bias": noise}
    # the noise doubles: relative to itself a 100 % error, relative to the model's norm far below 1e-6
    report = compare_grads(reference, {"big": big.clone(), "bias": noise * 2})
    assert report.ok and report.max_error < 1e-6
    wrong = compare_grads(reference, {"big": big * 1.01, "bias": noise})
    assert [name for name, _ in wrong.wrong] == ["big"] and wrong.state("big").startswith("wrong (")
    assert abs(wrong.max_error - 0.01) < 1e-6  # float32 rounding of 1.01


def test_tolerance_by_dtype_and_explicit_rtol():
    assert tolerance_for(torch.float32) == tolerance_for("float32") == 1e-6
    assert tolerance_for(torch.bfloat16) > tolerance_for(torch.float16) > tolerance_for(torch.float32)
    reference = {"w": torch.ones(4)}
    assert not compare_grads(reference, {"w": torch.ones(4) * 1.001}).ok
    assert compare_grads(reference, {"w": torch.ones(4) * 1.001}, rtol=1e-2).ok
    half = {"w": torch.ones(4, dtype=torch.bfloat16)}
    assert compare_grads(half, {"w": half["w"] * 1.001}).ok  # bf16's own bound


def test_summary_names_an_example_of_each_problem():
    report = GradReport(equal=["a"], missing=["m"], wrong=[("w", 0.5)], unexpected=["u"], max_error=0.5)
    text = report.summary()
    assert text.startswith("1/4 parameter gradients equal")
    assert "1 missing (e.g. m)" in text and "1 wrong (e.g. w: 5.0e-01)" in text and "1 unexpected (e.g. u)" in text


# --------------------------------------------------------------------------- short_error
def test_short_error_is_type_and_first_sentence_of_first_line():
    exc = RuntimeError("Trying to backward through the graph a second time (or directly access saved "
                       "tensors after they have already been freed). Saved intermediate values...\nmore")
    assert short_error(exc) == "RuntimeError: Trying to backward through the graph a second time"
    assert short_error(ValueError("")) == "ValueError"
    assert short_error(KeyError("x" * 500), limit=10) == "KeyError: " + "'" + "x" * 9


# --------------------------------------------------------------------------- children
def test_child_env_turns_hotfix_off_and_scrubs_settings_only_when_asked():
    base = {"PATH": "/bin", DISABLE_VAR: "1", "HOTFIX_LOG_LEVEL": "INFO", "PYTHONPATH": "/old"}
    on = child_env(True, base=base)
    assert DISABLE_VAR not in on and on["HOTFIX_LOG_LEVEL"] == "INFO" and on["PYTHONPATH"] == "/old"
    off = child_env(False, base=base, keep_hotfix_settings=False, pythonpath=["/a", "/b"], extra={"X": "1"})
    assert off[DISABLE_VAR] == "1" and "HOTFIX_LOG_LEVEL" not in off and off["X"] == "1"
    assert off["PYTHONPATH"].split(":") == ["/a", "/b"] or off["PYTHONPATH"].split(";") == ["/a", "/b"]
    assert "PYTHONPATH" not in child_env(True, base=base, pythonpath=[])
    assert base[DISABLE_VAR] == "1"  # the parent's mapping is not changed


def test_json_lines_keeps_only_json_objects_and_last_line_prefers_stderr():
    text = 'log line\n{"case": 1}\n{broken\n[1, 2]\n{"case": 2}\n'
    assert json_lines(text) == [{"case": 1}, {"case": 2}]

    class Proc:
        returncode = 3
        stdout = "out\n"
        stderr = "a\nlast words\n"

    assert last_line(Proc) == "last words"
    Proc.stderr, Proc.stdout = "", ""
    assert last_line(Proc) == "no output (exit status 3)"


# --------------------------------------------------------------------------- modes
class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gradient_checkpointing = False
        self._gradient_checkpointing_func = None


class _Model(torch.nn.Module):
    supports_gradient_checkpointing = True

    def __init__(self):
        super().__init__()
        self.layer = _Layer()
        self.kwargs = None

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.kwargs = gradient_checkpointing_kwargs
        self.layer.gradient_checkpointing = True
        self.layer._gradient_checkpointing_func = torch.utils.checkpoint.checkpoint


def test_modes_map_to_use_reentrant_and_a_tuple_names_its_own_enable_function():
    model = _Model()
    modes.enable(model, "reentrant")
    assert model.kwargs == {"use_reentrant": True}
    modes.enable(model, "non-reentrant")
    assert model.kwargs == {"use_reentrant": False}
    with pytest.raises(ValueError, match="unknown checkpointing mode"):
        modes.enable(model, "sideways")

    def new_api(m):
        m.layer.gradient_checkpointing = True
        m.layer._gradient_checkpointing_func = torch.utils.checkpoint.checkpoint

    custom = ("activation_checkpointing_enable", new_api)
    assert modes.mode_name(custom) == "activation_checkpointing_enable" and modes.mode_name("reentrant") == "reentrant"
    assert modes.unknown_modes(["reentrant", custom, "sideways", ("x", "not callable")]) == ["sideways", ("x", "not callable")]
    assert "checkpoint" in modes.enable(_Model(), custom)
    with pytest.raises(NotImplementedError, match="set no checkpoint function"):
        modes.enable(_Model(), ("noop", lambda m: None))


def test_a_model_that_declares_no_checkpointing_is_refused():
    model = _Model()
    model.supports_gradient_checkpointing = False
    with pytest.raises(NotImplementedError, match="supports_gradient_checkpointing is False"):
        modes.enable(model, "reentrant")
    with pytest.raises(NotImplementedError, match="no gradient_checkpointing_enable"):
        modes.enable(torch.nn.Linear(2, 2), "reentrant")


class _OldModel(torch.nn.Module):
    """transformers before 4.35: gradient_checkpointing_enable() takes no kwargs, and the model calls torch's
    checkpoint from its own forward (no _gradient_checkpointing_func on any layer)."""

    supports_gradient_checkpointing = True

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.linear, x, use_reentrant=True) if self.gradient_checkpointing \
            else self.linear(x)


def test_a_release_whose_enable_takes_no_kwargs_is_could_not_check_never_a_traceback():
    """check-model on transformers 4.34 raised TypeError (unexpected gradient_checkpointing_kwargs) out of
    check_model: a traceback.  Each mode is now not-supported, with the reason; the verdict: could not check."""
    from hotfix.diagnostics.checker import check_model

    report = check_model(_OldModel(), {"x": torch.randn(2, 3)})
    found = {m.mode: (m.status, m.error) for m in report.modes}
    assert {status for status, _ in found.values()} == {"not-supported"}, found
    assert "takes no gradient_checkpointing_kwargs" in found["reentrant"][1]
    assert "own code" in found["default"][1]
    assert not report.safe and not report.supported


def test_doctor_on_a_release_no_fix_reaches_says_not_covered_and_runs_nothing(monkeypatch, capsys):
    from hotfix.diagnostics import doctor
    from hotfix.patch import Mechanism, Patch
    from hotfix.registry import registry

    class Older(Patch):
        name = "unit-older"
        mechanisms = (Mechanism("m-old", {"transformers": ">=999"}, unreached={"transformers": "<999"}),)

    monkeypatch.setattr(registry, "patches", lambda: {"unit-older": Older()})
    monkeypatch.setattr(doctor, "_run_child", lambda disabled: pytest.fail("doctor ran a case"))
    assert doctor.main([]) == 2
    out = capsys.readouterr().out
    assert "unit-older: NOT COVERED: transformers " in out and "is outside what this fix reaches" in out, out


# --------------------------------------------------------------------------- results, guard, memory
def test_mode_result_reads_its_counts_through_the_grad_report():
    result = ModeResult(mode="reentrant", status="equal")
    assert result.grads is None and result.total == 0 and not result.missing
    result.grads = compare_grads({"a": torch.ones(1), "b": torch.ones(1)}, {"a": torch.ones(1)})
    assert (result.equal, result.missing, result.total) == (1, ["b"], 2)


def test_watchdog_trips_on_time_and_is_reset_by_the_next_step():
    dog = Watchdog(baseline=0, memory_limit=2**40, hard_exit=False, grace=1.0)
    try:
        dog.begin("reentrant", time_limit=0.05)
        deadline = time.monotonic() + 5
        while dog.reason is None and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(GuardTripped, match="time guard: the reentrant step"):
            dog.check()
        dog.begin("next", time_limit=60)
        dog.check()  # a new step starts clean
        dog.end()
    finally:
        dog.stop()


@pytest.mark.parametrize("text, value", [("4GiB", 4 * 2**30), ("512M", 512 * 2**20), ("1.5g", int(1.5 * 2**30)),
                                         ("1000", 1000), ("2 KiB", 2048), ("3kb", 3072)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("value", ["lots", "-1", "0", ""])
def test_check_model_refuses_a_memory_limit_that_is_not_a_size_in_one_usage_line(value, capsys):
    """--memory-limit lots raised ValueError out of check-model (a traceback); argparse now says why, status 2."""
    from hotfix.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["check-model", "pkg:build", "--memory-limit", value])
    assert exited.value.code == 2
    assert f"argument --memory-limit: {value!r} is not a size in bytes" in capsys.readouterr().err


BUILDERS = """
import torch

class Model(torch.nn.Module):
    supports_gradient_checkpointing = True

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        import functools
        self._gradient_checkpointing_func = functools.partial(torch.utils.checkpoint.checkpoint,
                                                              **(gradient_checkpointing_kwargs or {}))
        self.gradient_checkpointing = True

    def forward(self, x):
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(self.lin, x)
        return self.lin(x)

class ExitsInForward(Model):
    def forward(self, x):
        raise SystemExit(3)

def batch():
    return {"x": torch.randn(2, 4, requires_grad=True)}

def good(): return Model(), batch()
def not_a_model(): return object(), batch()
def exits(): raise SystemExit(7)
def one_item(): return (Model(),)
def model_alone(): return Model()
def swapped(): return batch(), Model()
def loss_not_callable(): return Model(), batch(), 5
def exits_in_a_step(): return ExitsInForward(), batch()
def interrupted(): raise KeyboardInterrupt
"""

#: builder -> what the one line says (exit status 2: could not check)
BAD_BUILDERS = {
    "not_a_model": "the factory's model is of type object, not a torch.nn.Module",
    "exits": "it raised SystemExit(7)",
    "one_item": "the factory returned a tuple of length 1; it must return (model, batch)",
    "model_alone": "the factory returned an object of type Model; it must return (model, batch)",
    "swapped": "the factory's model is of type dict, not a torch.nn.Module (model and batch swapped?)",
    "loss_not_callable": "the factory's loss_fn is of type int, not a callable",
    "exits_in_a_step": "could not check",
}


@pytest.fixture
def builders(tmp_path):
    path = tmp_path / "builders.py"
    path.write_text(BUILDERS)
    return str(path)


@pytest.mark.parametrize("builder", BAD_BUILDERS)
def test_check_model_on_a_builder_that_returns_no_model_or_exits_is_one_line_and_status_2(builder, builders, capsys):
    """Issue 31 item 10: ``(object(), batch)`` was a traceback and exit 1 ("unsafe"); ``SystemExit(7)`` from the
    builder exited 7 without a word, from a model's forward 3 ("a step overran its guard"); a swapped pair or a
    loss_fn that is not callable was a traceback or a whole report.  Each is one line and exit 2."""
    from hotfix.cli import main

    assert main(["check-model", f"{builders}:{builder}", "--modes", "reentrant"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, (out, err)
    assert err.startswith("hotfix check-model: ") and BAD_BUILDERS[builder] in err, err


def test_check_model_interrupted_is_one_line_and_status_130(builders, capsys):
    from hotfix.cli import main

    assert main(["check-model", f"{builders}:interrupted"]) == 130
    assert capsys.readouterr().err == "hotfix: interrupted\n"


@pytest.mark.parametrize("flag, value", [("--time-limit", "0"), ("--time-limit", "nan"), ("--rtol", "-1"),
                                         ("--rtol", "nan"), ("--floor", "-0.5"), ("--grace", "-1")])
def test_check_model_refuses_numbers_that_would_give_a_false_verdict_in_one_usage_line(flag, value, capsys):
    """``--time-limit 0`` or ``--rtol -1`` made every mode UNSAFE (exit 1), ``--time-limit nan`` disabled the
    guard: a verdict on the options, not on the model.  argparse now says why, status 2."""
    from hotfix.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["check-model", "pkg:build", flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: {value!r} is not " in capsys.readouterr().err


def test_version_names_the_distribution_and_where_it_runs_from(capsys, monkeypatch):
    """One line, never wrapped at the terminal's width (argparse's version action split a long path)."""
    import os

    import hotfix
    from hotfix.cli import main

    monkeypatch.setenv("COLUMNS", "40")
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"hotfix-checkpoint {hotfix.__version__} from {os.path.dirname(hotfix.__file__)} (Python ")
    assert out.count("\n") == 1, out


def test_a_reader_that_stops_reading_ends_the_output_quietly_and_the_verdict_still_decides(builders, monkeypatch):
    """``hotfix check-model ... | head -1``: the rest of the report is dropped, no BrokenPipeError, and the exit
    status is still the verdict's (0 safe here), not an error of the pipe."""
    import os
    import sys

    from hotfix.cli import main

    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", buffering=1) as gone:  # line-buffered: the first line meets the closed pipe
        monkeypatch.setattr(sys, "stdout", gone)
        assert main(["check-model", f"{builders}:good", "--modes", "non-reentrant"]) == 0
        assert main(["status", "--no-import"]) == 0


def test_fmt_bytes():
    assert (fmt_bytes(None), fmt_bytes(12), fmt_bytes(-2048), fmt_bytes(3 * 2**30)) == ("n/a", "12 B", "-2.0 KiB", "3.0 GiB")


class _LazilyHooked(_Model):
    """Installs a forward hook on its first forward and marks itself, as transformers 5.x does for its
    hidden-state capture (``_output_capturing_hooks_installed``); later forwards read what the hook caught."""

    def __init__(self):
        super().__init__()
        self.inner, self.head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
        self.caught = []

    def forward(self, x):
        if not getattr(self, "_output_capturing_hooks_installed", False):
            self.inner.register_forward_hook(lambda module, args, output: self.caught.append(output))
            self._output_capturing_hooks_installed = True
        self.caught.clear()
        self.inner(x)
        (hidden,) = self.caught  # ValueError where the hook is gone but the mark stayed
        return self.head(hidden)


def test_a_check_restores_lazily_installed_hooks_with_their_mark():
    """The check's restore between modes removes hooks the reference step installed; the mark that
    says they are installed must go with them, or every checkpointed mode runs unhooked (5.23
    depth_pro: IndexError in every mode, a checker artifact)."""
    from hotfix.diagnostics.checker import check_model

    model = _LazilyHooked()
    report = check_model(model, torch.randn(2, 3), loss_fn=lambda output, batch: output.sum(), modes=["reentrant"])
    assert report.reference.status == "reference", report.reference.error
    assert report.modes[0].status == "equal", report.modes[0].error
    assert "_output_capturing_hooks_installed" not in vars(model) and not model.inner._forward_hooks  # as before
