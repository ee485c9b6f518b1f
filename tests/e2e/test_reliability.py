"""Reliability and abuse: whatever happens, the user's import and training go on,
and hotfix says what happened in one line on the ``hotfix`` logger.

Complements tests/e2e/test_activation.py and test_activation_api.py (which cover: a plugin whose
``_apply`` raises, one that cannot be imported, one whose target drifted; the
HOTFIX_DISABLE spellings 1/true/YES/" on "/0/false/""/maybe; an unknown name in
HOTFIX_DISABLED_PATCHES; activate twice + revert + activate on one model;
``python -S`` / ``python -I`` running ``pass``; HOTFIX_DISABLE=1 importing
transformers).  Here: the rest of the environment-variable space, failures
*on the same target* as the built-in fix, and a boot whose ``import hotfix``
fails.  tests/e2e/test_reliability_runtime.py: 8 threads racing on the first
``import transformers``, ``importlib.reload`` of a target, exact restoration
after repeated import/activate/revert, ``python -I`` with transformers.
tests/e2e/test_reliability_processes.py: spawn-started processes and DataLoader
workers, ``pip uninstall`` in a throwaway venv, and what the ``.pth`` line
touches at interpreter start.

Scenarios that depend on interpreter start run in fresh interpreters
(``run_child`` / ``run_python``); pure parsing runs in-process.
"""

from __future__ import annotations

import logging

import pytest

from conftest import hotfix_lines, plugin_dir, run_child

KEYWORD_PATCH = "transformers-checkpoint-layer-io"


# ----------------------------------------------------------------------------
# 1. Environment variables: every odd value has a documented outcome
# ----------------------------------------------------------------------------
# value -> (disabled?, warns?)   (README "Environment variables")
DISABLE_CASES = {
    None: (False, False),
    "": (False, False),
    "   ": (False, False),
    "\t": (False, False),
    " 1 ": (True, False),
    "TRUE": (True, False),
    "Yes": (True, False),
    "Off": (False, False),
    " NO ": (False, False),
    "maybe": (True, True),
    "2": (True, True),
    "-1": (True, True),
    "yes please": (True, True),
    "disable": (True, True),
}
PATCH_LIST_CASES = {
    None: frozenset(),
    "": frozenset(),
    " , ,, ": frozenset(),
    " Transformers_Checkpoint_Layer_IO , ": frozenset({KEYWORD_PATCH}),
    "a,B_c , a": frozenset({"a", "b-c"}),
}
LOG_LEVEL_CASES = {  # value -> (level applied, warns?)
    None: (None, False),
    "": (None, False),
    "  ": (None, False),
    "debug": ("DEBUG", False),
    " Info ": ("INFO", False),
    "ERROR": ("ERROR", False),
    "garbage": (None, True),
    "10": (None, True),
    "CRITICAL": (None, True),  # not one of the four documented levels
}


def _settings(environ, caplog):
    from hotfix.config import read_settings

    hotfix_logger = logging.getLogger("hotfix")
    level = hotfix_logger.level
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="hotfix"):
            settings = read_settings({k: v for k, v in environ.items() if v is not None})
    finally:
        hotfix_logger.setLevel(level)
    warnings = [r.getMessage() for r in caplog.records if r.name == "hotfix" and r.levelno >= logging.WARNING]
    return settings, warnings


@pytest.mark.parametrize("value", list(DISABLE_CASES), ids=repr)
def test_hotfix_disable_value_space(value, caplog):
    """HOTFIX_DISABLE: documented spellings disable or enable silently (any
    case, surrounding spaces ignored; empty or blank = unset); anything else
    gets exactly one warning naming the variable and the value, and disables.
    The boot module agrees: it stands aside only for the documented spellings
    and leaves every other value to hotfix.config (which warns)."""
    from hotfix.startup.hook import BOOT as boot

    disabled, warns = DISABLE_CASES[value]
    settings, warnings = _settings({"HOTFIX_DISABLE": value}, caplog)
    assert settings.disabled is disabled
    assert len(warnings) == (1 if warns else 0), warnings
    if warns:
        assert "HOTFIX_DISABLE" in warnings[0] and repr(value) in warnings[0]
    boot_env = {} if value is None else {"HOTFIX_DISABLE": value}
    assert boot.disabled(boot_env) is (disabled and not warns)


@pytest.mark.parametrize("value", list(PATCH_LIST_CASES), ids=repr)
def test_disabled_patches_value_space(value, caplog):
    """HOTFIX_DISABLED_PATCHES: comma list, blanks and empty items ignored,
    ``_``/``-`` and case folded, duplicates collapse; parsing never warns
    (unknown names are warned about at activation, tests/e2e/test_activation.py)."""
    settings, warnings = _settings({"HOTFIX_DISABLED_PATCHES": value}, caplog)
    assert settings.disabled_patches == PATCH_LIST_CASES[value]
    assert warnings == []


@pytest.mark.parametrize("value", list(LOG_LEVEL_CASES), ids=repr)
def test_log_level_value_space(value, caplog):
    """HOTFIX_LOG_LEVEL: DEBUG/INFO/WARNING/ERROR in any case and spacing set
    the ``hotfix`` logger's level; anything else (a number, CRITICAL, garbage)
    gets one warning and leaves the logger as configured."""
    level, warns = LOG_LEVEL_CASES[value]
    hotfix_logger = logging.getLogger("hotfix")
    before = hotfix_logger.level
    settings, warnings = _settings({"HOTFIX_LOG_LEVEL": value}, caplog)
    assert settings.log_level == level
    assert len(warnings) == (1 if warns else 0), warnings
    if warns:
        assert "HOTFIX_LOG_LEVEL" in warnings[0] and repr(value) in warnings[0]
    assert hotfix_logger.level == before  # restored by _settings; nothing else touched it


# ----------------------------------------------------------------------------
# 2. Everything going wrong at once, on the fix's own target: training still works
# ----------------------------------------------------------------------------
HOSTILE_PLUGINS = {
    "hostile_plugins.py": """
        from hotfix import Patch

        class RaisesOnLayers(Patch):      # same target as the built-in fix
            name = "raises-on-layers"
            targets = ("transformers.modeling_layers",)
            def _apply(self, module):
                self.replace(module.GradientCheckpointingLayer, "hostile_marker", True)
                raise RuntimeError("raises-on-layers blew up")

        class DriftRaises(Patch):
            name = "drift-raises"
            targets = ("transformers.modeling_layers",)
            def drift(self, module):
                raise KeyError("drift check itself broke")
            def _apply(self, module):
                self.replace(module, "drift_raises_touched", True)

        class RevertRaises(Patch):
            name = "revert-raises"
            targets = ("transformers.modeling_layers",)
            def _apply(self, module):
                self.replace(module, "revert_raises_touched", True)
            def _revert(self):
                raise OSError("revert-raises cannot undo")

        raises_on_layers = RaisesOnLayers()
        drift_raises = DriftRaises()
        revert_raises = RevertRaises()
        not_a_patch = object()
    """,
}
HOSTILE_ENTRY_POINTS = """
    raises-on-layers = hostile_plugins:raises_on_layers
    drift-raises = hostile_plugins:drift_raises
    revert-raises = hostile_plugins:revert_raises
    not-a-patch = hostile_plugins:not_a_patch
    missing-attribute = hostile_plugins:does_not_exist
"""


def test_hostile_plugins_and_bad_env_leave_training_working(tmp_path):
    """Third-party patches on transformers.modeling_layers that raise in
    ``_apply``, in ``drift`` or in ``_revert``, an entry point that is not a
    Patch, one naming a missing attribute, plus HOTFIX_LOG_LEVEL=garbage,
    HOTFIX_DISABLE="   " and an unknown opt-out name - all at once, through the
    .pth: the built-in fix is still applied, Whisper trains with correct
    gradients, every problem is exactly one ``hotfix:`` line, and revert()
    still restores the built-in fix when another patch's revert fails."""
    plugins = plugin_dir(tmp_path, "hostile-plugins", HOSTILE_PLUGINS, HOSTILE_ENTRY_POINTS)
    proc, seen = run_child(
        """
        import transformers
        import transformers.modeling_layers as ml
        model, batch = tiny_whisper()
        reference = reference_grads(model, batch)
        model.gradient_checkpointing_enable()
        out = dict(
            hotfix_loaded="hotfix" in sys.modules,
            step=step(model, batch, reference),
            marker=hasattr(ml.GradientCheckpointingLayer, "hostile_marker"),
            drift_touched=hasattr(ml, "drift_raises_touched"),
        )
        import hotfix
        out["reverted"] = sorted(hotfix.revert())
        out["descriptor_after_revert"] = "_gradient_checkpointing_func" in ml.GradientCheckpointingLayer.__dict__
        report(**out)
        """,
        pythonpath=[plugins],
        env={"HOTFIX_LOG_LEVEL": "garbage", "HOTFIX_DISABLE": "   ", "HOTFIX_DISABLED_PATCHES": "no-such-fix"},
    )
    assert seen["hotfix_loaded"] is True
    assert seen["step"] == {"ok": True, "grads_match": True}
    assert seen["marker"] is False  # the half-applied change was rolled back
    assert seen["drift_touched"] is False
    assert KEYWORD_PATCH in seen["reverted"] and "revert-raises" not in seen["reverted"]
    assert seen["descriptor_after_revert"] is False

    lines = hotfix_lines(proc.stderr)
    expected = {
        "log level": lambda l: "HOTFIX_LOG_LEVEL" in l and "garbage" in l,
        "unknown opt-out": lambda l: "no-such-fix" in l and "known patches" in l,
        "not a patch": lambda l: "not-a-patch" in l and "not a hotfix.Patch" in l,
        "missing attribute": lambda l: "missing-attribute" in l and "could not be loaded" in l,
        "apply raises": lambda l: "raises-on-layers" in l and "failed to apply" in l and "blew up" in l,
        "drift raises": lambda l: "drift-raises" in l and "drift check failed" in l,
        "revert raises": lambda l: "revert-raises" in l and "failed to revert" in l,
    }
    for what, matches in expected.items():
        assert len([l for l in lines if matches(l)]) == 1, (what, proc.stderr)
    assert len(lines) == len(expected), proc.stderr


def test_boot_survives_a_broken_hotfix_import(tmp_path):
    """If ``import hotfix`` itself fails during the automatic activation (here
    a broken ``wrapt`` shadows the real one), ``import transformers`` still
    succeeds, one line on stderr says so, and training runs as upstream
    (non-reentrant checkpointing, unaffected by the bug, trains)."""
    (tmp_path / "wrapt.py").write_text("raise ImportError('wrapt is broken on purpose')\n")
    proc, seen = run_child(
        """
        import transformers
        model, batch = tiny_whisper()
        reference = reference_grads(model, batch)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        report(transformers=transformers.__version__, hotfix_active="hotfix.registry" in sys.modules,
               step=step(model, batch, reference))
        """,
        pythonpath=[tmp_path],
    )
    assert seen["hotfix_active"] is False
    assert seen["step"] == {"ok": True, "grads_match": True}
    lines = hotfix_lines(proc.stderr)
    assert len(lines) == 1 and "auto-activation failed" in lines[0] and "wrapt is broken" in lines[0], proc.stderr
