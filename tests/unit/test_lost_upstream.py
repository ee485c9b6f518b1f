"""Releases where upstream drops a mechanism's state before any checkpoint function sees it (``hotfix.Lost``).

transformers 5.5.0 - 5.5.1 share Gemma-4's keys/values (``num_kv_shared_layers``) through the Cache, which
GradientCheckpointingLayer sets to None under checkpointing (huggingface/transformers#45242; 5.5.2 shares them
outside it).  The fix applies there and cannot restore that: ``hotfix status`` and ``hotfix doctor`` must say
NOT COVERED, with the reason, instead of a bare APPLIED (docs/versions.md, "patch releases at boundaries").
In-process: a transformers dist-info of the release asked for, first on ``sys.path``, and a module of that
``__version__`` in its place (the version reader prefers the imported module's).
"""

from __future__ import annotations

import io
import sys
import types

import pytest

from hotfix.patch import Lost, Mechanism, Patch


@pytest.fixture
def transformers_release(tmp_path, monkeypatch):
    """``transformers_release("5.5.1")``: the version reader now finds transformers 5.5.1 installed and imported."""

    def install(version: str) -> None:
        folder = tmp_path / version
        info = folder / f"transformers-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(__version__=version))

    return install


def _status_line(fix: str) -> str:
    from hotfix.cli import status

    out = io.StringIO()
    status(import_targets=False, out=out)
    return next(line for line in out.getvalue().splitlines() if line.strip().startswith(f"{fix}:"))


def test_status_on_5_5_1_says_gemma4_kv_sharing_is_not_covered(transformers_release):
    transformers_release("5.5.1")
    line = _status_line("transformers-checkpoint-layer-io")
    assert "NOT COVERED here: transformers 5.5.1: Gemma-3n" in line, line
    assert "; transformers 5.5.1: Gemma-4 with num_kv_shared_layers" in line and "#45242" in line, line
    assert "#45312): shared-mapping broken here, and hotfix cannot restore it" in line, line


@pytest.mark.parametrize("release, said, unsaid", [
    ("4.57.6", [], ["NOT COVERED"]),  # 4.x builds no Cache in training: nothing shared to lose
    ("5.0.0", ["NOT COVERED here: transformers 5.0.0: Gemma-3n"], ["Gemma-4"]),
    ("5.5.2", ["NOT COVERED here: transformers 5.5.2: Gemma-3n"], ["Gemma-4"]),  # 5.5.2: Gemma-4 outside the Cache
    ("5.6.0", [], ["NOT COVERED"]),
    ("5.11.0", ["NOT COVERED here: transformers 5.11.0: DiffusionGemma", "cache-contents broken here"], ["Gemma-"]),
    ("5.23.0", [], ["NOT COVERED"]),
])
def test_status_says_not_covered_exactly_where_a_cache_is_dropped(transformers_release, release, said, unsaid):
    transformers_release(release)
    line = _status_line("transformers-checkpoint-layer-io")
    assert all(text in line for text in said) and not any(text in line for text in unsaid), line


def test_doctor_on_5_5_1_says_not_covered_and_still_runs_its_cases(transformers_release, monkeypatch, capsys):
    from hotfix.diagnostics import doctor

    transformers_release("5.5.1")
    ran = []

    def child(disabled):
        ran.append(disabled)
        return [{"case": case, "status": "trains", "loss": 1.0, "summary": "every gradient equal"}
                for case, _ in doctor.CASES]

    monkeypatch.setattr(doctor, "_run_child", child)
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "transformers-checkpoint-layer-io: NOT COVERED: transformers 5.5.1: Gemma-3n" in out, out
    assert "transformers 5.5.1: Gemma-4 with num_kv_shared_layers" in out, out
    assert ran == [True, False] and "NOT COVERED on this release (above): transformers-checkpoint-layer-io" in out


def test_an_applied_fix_with_a_lost_mechanism_says_both():
    """Applied where its range holds, and NOT COVERED for what upstream drops there (wrapt stands for the target)."""
    from hotfix.status import state

    class Partly(Patch):
        name = "unit-partly"
        mechanisms = (Mechanism("m", {"wrapt": ">=1"}, lost=(Lost({"wrapt": ">=1"}, "the layer drops its cache"),)),)

    fix = Partly()
    assert fix.check().applies
    assert fix.uncovered_here().endswith(": the layer drops its cache: m broken here, and hotfix cannot restore it")
    assert state(fix, False, True, {}).endswith("; NOT COVERED here: " + fix.uncovered_here())
    fix.mechanisms = (Mechanism("m", {"wrapt": ">=1"}, lost=(Lost({"wrapt": "<1"}, "elsewhere"),)),)
    assert fix.uncovered_here() is None


@pytest.mark.parametrize("lost", [Lost({"wrapt": ">=1"}, ""), Lost({}, "why"), Lost({"wrapt": ">=x"}, "why"),
                                  Lost({"wrapt": ">=1"}, "why", "gemma4"), Lost({"wrapt": ">=1"}, "why", ("",)),
                                  {"wrapt": ">=1"}, (("wrapt", ">=1"),)])
def test_a_lost_declaration_without_a_range_a_reason_or_model_type_names_is_invalid(lost):
    class Bad(Patch):
        name = "unit-bad-lost"
        mechanisms = (Mechanism("m", {"wrapt": ">=1"}, lost=lost if isinstance(lost, dict) else (lost,)),)

    error = Bad().declaration_error()
    assert error and "mechanism 'm': lost" in error, error


@pytest.mark.parametrize("model_types", [(), ("gemma4", "gemma4_text"), ["gemma4"]])
def test_a_lost_declaration_naming_its_models_as_a_tuple_or_a_list_is_valid_and_the_fix_applies(model_types):
    """``model_types`` reads like ``lost=`` and ``targets``: a list is as good as a tuple (a declaration error
    would keep the whole fix from applying), and naming models changes nothing hotfix status says."""
    class Named(Patch):
        name = "unit-named-lost"
        mechanisms = (Mechanism("m", {"wrapt": ">=1"}, lost=(Lost({"wrapt": ">=1"}, "the layer drops its cache",
                                                                   model_types),)),)

    fix = Named()
    assert fix.declaration_error() is None and fix.check().applies
    assert fix.uncovered_here().endswith(": the layer drops its cache: m broken here, and hotfix cannot restore it")


def test_check_model_says_not_covered_for_the_model_it_checked_only(monkeypatch):
    """One policy for status, doctor and check-model (hotfix.status.not_covered): check-model names what upstream
    drops on the installed release for the model it checked (``Lost.model_types``), and nothing for another
    model, where ``hotfix status`` (which knows no model) names it for every one."""
    import torch

    from hotfix.diagnostics.checker import check_model
    from hotfix.registry import registry

    class About(Patch):
        name = "unit-about"
        mechanisms = (Mechanism("m", {"wrapt": ">=1"}, lost=(Lost({"wrapt": ">=1"}, "the lab model drops it",
                                                                   ("lab_model",)),)),)

    fix = About()
    monkeypatch.setattr(registry, "patches", lambda: {fix.name: fix})
    monkeypatch.setattr(registry, "active", True)

    def report(model_type):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
        model.config = types.SimpleNamespace(model_type=model_type)
        return check_model(model, torch.randn(2, 4), loss_fn=lambda out, batch: out.sum(), modes=["reentrant"])

    lab, other = report("lab_model"), report("whisper")
    assert lab.not_covered == [f"unit-about: {fix.uncovered_here('lab_model')}"] and "the lab model drops it" in \
        lab.format().splitlines()[-1]
    assert other.not_covered == [] and fix.uncovered_here("whisper") is None and fix.uncovered_here() is not None
