"""Reliability and abuse: whatever happens, the user's import and training go on,
and hotfix says what happened in one line on the ``hotfix`` logger.

Complements tests/test_activation.py (which already covers: a plugin whose
``_apply`` raises, one that cannot be imported, one whose target drifted; the
HOTFIX_DISABLE spellings 1/true/YES/" on "/0/false/""/maybe; an unknown name in
HOTFIX_DISABLED_PATCHES; activate twice + revert + activate on one model;
``python -S`` / ``python -I`` running ``pass``; HOTFIX_DISABLE=1 importing
transformers).  Here: the rest of the environment-variable space, failures
*on the same target* as the built-in fix, a boot whose ``import hotfix``
fails, 8 threads racing on the first ``import transformers``,
``importlib.reload`` of a target, exact restoration after repeated
import/activate/revert, ``python -I`` with transformers, spawn-started
processes and DataLoader workers, ``pip uninstall`` in a throwaway venv, and
what the ``.pth`` line touches at interpreter start.

Scenarios that depend on interpreter start run in fresh interpreters
(``run_child`` / ``run_python``); pure parsing runs in-process.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, json_lines, run_python
from test_activation import CRASH, hotfix_lines, run_child

KEYWORD_PATCH = "transformers-keyword-tensors"
TARGET = "transformers.modeling_layers"
SITE = Path(sysconfig.get_paths()["purelib"])


def _plugin_dir(tmp_path: Path, name: str, modules: dict, entry_points: str) -> Path:
    """A third-party distribution on disk: modules + a dist-info with hotfix.patches entry points."""
    for relative, text in modules.items():
        (tmp_path / relative).write_text(textwrap.dedent(text))
    info = tmp_path / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hotfix.patches]\n" + textwrap.dedent(entry_points))
    return tmp_path


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
    " Transformers_Keyword_Tensors , ": frozenset({KEYWORD_PATCH}),
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
    import _hotfix_boot

    disabled, warns = DISABLE_CASES[value]
    settings, warnings = _settings({"HOTFIX_DISABLE": value}, caplog)
    assert settings.disabled is disabled
    assert len(warnings) == (1 if warns else 0), warnings
    if warns:
        assert "HOTFIX_DISABLE" in warnings[0] and repr(value) in warnings[0]
    boot_env = {} if value is None else {"HOTFIX_DISABLE": value}
    assert _hotfix_boot.disabled(boot_env) is (disabled and not warns)


@pytest.mark.parametrize("value", list(PATCH_LIST_CASES), ids=repr)
def test_disabled_patches_value_space(value, caplog):
    """HOTFIX_DISABLED_PATCHES: comma list, blanks and empty items ignored,
    ``_``/``-`` and case folded, duplicates collapse; parsing never warns
    (unknown names are warned about at activation, tests/test_activation.py)."""
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
    plugins = _plugin_dir(tmp_path, "hostile-plugins", HOSTILE_PLUGINS, HOSTILE_ENTRY_POINTS)
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


# ----------------------------------------------------------------------------
# 3. 8 threads race on the first import of transformers
# ----------------------------------------------------------------------------
def test_eight_threads_import_transformers_at_once():
    """With the .pth active, 8 threads released together by a barrier all
    import transformers: no error, every thread sees the patched class, and
    each patch is applied exactly once (one INFO line, one applied target)."""
    proc, seen = run_child(
        """
        import logging, threading
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        N = 8
        barrier = threading.Barrier(N)
        seen, errors = [], []

        def work():
            try:
                barrier.wait()
                import transformers
                from transformers.modeling_layers import GradientCheckpointingLayer
                seen.append(type(GradientCheckpointingLayer.__dict__.get("_gradient_checkpointing_func")).__name__)
            except Exception as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=work) for _ in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        from hotfix.registry import registry
        model, batch = tiny_whisper()
        reference = reference_grads(model, batch)
        model.gradient_checkpointing_enable()
        report(seen=seen, errors=errors, step=step(model, batch, reference),
               applied={name: list(p.applied_targets) for name, p in registry.patches().items()})
        """
    )
    assert seen["errors"] == []
    assert seen["seen"] == ["CheckpointFunctionSlot"] * 8
    assert seen["applied"][KEYWORD_PATCH] == [TARGET]
    assert seen["step"] == {"ok": True, "grads_match": True}
    applied_lines = [l for l in hotfix_lines(proc.stderr) if l.startswith("hotfix: applied ")]
    assert len([l for l in applied_lines if f"applied {KEYWORD_PATCH} to {TARGET}" in l]) == 1, proc.stderr
    # no patch of any kind applied twice to the same target
    assert len(applied_lines) == len(set(l.split(" (")[0] for l in applied_lines)), proc.stderr


# ----------------------------------------------------------------------------
# 4. importlib.reload of a target module
# ----------------------------------------------------------------------------
RELOAD_PLUGIN = {
    "reload_defs.py": """
        class Thing:
            def value(self):
                return 1
    """,
    "reload_target.py": """
        from reload_defs import Thing          # survives a reload of reload_target unchanged
        def fresh():                           # re-created by every reload
            return "fresh"
    """,
    "reload_plugin.py": """
        from hotfix import Patch

        class WrapBoth(Patch):
            name = "wrap-both"
            targets = ("reload_target",)
            def _apply(self, module):
                self.wrap(module.Thing, "value", lambda wrapped, instance, args, kwargs: wrapped() + 10)
                self.wrap(module, "fresh", lambda wrapped, instance, args, kwargs: wrapped() + "+fixed")

        patch = WrapBoth()
    """,
}


def test_reload_of_a_target_is_patched_again_never_twice(tmp_path):
    """``importlib.reload(transformers.modeling_layers)`` makes a new
    GradientCheckpointingLayer: hotfix patches it again (one INFO line per
    reload), models built from the new class train correctly, models built
    before keep working, revert() restores both classes.  A patch whose
    target re-imports an object unchanged (``from x import Thing``) is not
    stacked on itself by the reload: ``Thing.value`` stays wrapped once."""
    plugins = _plugin_dir(tmp_path, "reload-plugin", RELOAD_PLUGIN, "wrap-both = reload_plugin:patch\n")
    proc, seen = run_child(
        """
        import importlib, logging
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        import transformers.modeling_layers as ml
        import hotfix, reload_target
        old_layer = ml.GradientCheckpointingLayer
        old_model, batch = tiny_whisper()
        reference = reference_grads(old_model, batch)
        old_model.gradient_checkpointing_enable()

        out = {"plugin_before": [reload_target.Thing().value(), reload_target.fresh()]}
        for _ in range(2):
            importlib.reload(ml)
            importlib.reload(reload_target)
        layer = ml.GradientCheckpointingLayer
        out["new_class"] = layer is not old_layer
        out["descriptor"] = type(layer.__dict__.get("_gradient_checkpointing_func")).__name__
        out["loader_restored"] = type(ml.__loader__).__name__ == type(ml.__spec__.loader).__name__ == "SourceFileLoader"
        out["plugin_after"] = [reload_target.Thing().value(), reload_target.fresh()]

        import copy, torch
        import transformers.models.whisper.modeling_whisper as mw
        importlib.reload(mw)  # so the model below is built from the reloaded layer class
        torch.manual_seed(0)  # tiny_whisper's seed: same weights as old_model
        new_model = mw.WhisperForConditionalGeneration(copy.deepcopy(old_model.config)).train()
        new_model.gradient_checkpointing_enable()
        out["new_model_uses_new_class"] = isinstance(new_model.model.decoder.layers[0], layer)
        stored = layer_checkpoint_function(new_model)
        wrapper = new_model.model.decoder.layers[0]._gradient_checkpointing_func
        chain, inner = [], wrapper  # each fix's wrapper at most once around transformers' function
        while type(inner).__name__ == "FunctionWrapper":
            chain.append(inner._self_wrapper.__name__)
            inner = inner.__wrapped__
        out["wrapped_once"] = inner is stored and len(chain) == len(set(chain)) >= 1
        out["new_model"] = step(new_model, batch, reference)
        out["old_model"] = step(old_model, batch, reference)
        out["reverted"] = sorted(hotfix.revert())
        out["restored"] = [ATTR not in c.__dict__ for c in (old_layer, layer)]
        out["plugin_reverted"] = [reload_target.Thing().value(), reload_target.fresh()]
        out["after_revert"] = step(new_model, batch)
        report(**out)
        """.replace("ATTR", repr("_gradient_checkpointing_func")),
        pythonpath=[plugins],
    )
    assert seen["plugin_before"] == [11, "fresh+fixed"]
    assert seen["new_class"] is True
    assert seen["descriptor"] == "CheckpointFunctionSlot"
    assert seen["loader_restored"] is True
    assert seen["plugin_after"] == [11, "fresh+fixed"]  # not 21: never wrapped twice
    assert seen["new_model_uses_new_class"] is True
    assert seen["wrapped_once"] is True
    assert seen["new_model"] == {"ok": True, "grads_match": True}
    assert seen["old_model"] == {"ok": True, "grads_match": True}
    assert "wrap-both" in seen["reverted"] and KEYWORD_PATCH in seen["reverted"]
    assert seen["restored"] == [True, True]
    assert seen["plugin_reverted"] == [1, "fresh"]
    assert seen["after_revert"]["ok"] is False and CRASH in seen["after_revert"]["error"]
    lines = hotfix_lines(proc.stderr)
    assert len([l for l in lines if f"re-applied {KEYWORD_PATCH} to {TARGET} after importlib.reload" in l]) == 2
    assert len([l for l in lines if "re-applied wrap-both to reload_target after importlib.reload" in l]) == 2
    assert not [l for l in lines if "WARNING" in l or "failed" in l], proc.stderr


# ----------------------------------------------------------------------------
# 5. import twice, activate twice, revert, activate: exact restoration
# ----------------------------------------------------------------------------
def test_repeated_import_activate_revert_restores_objects_exactly():
    """Snapshot every attribute of every loaded patch target (module dict and
    the dicts of the classes it defines) before hotfix; then ``import hotfix``
    twice, ``importlib.reload(hotfix)``, ``activate()`` twice, ``revert()``
    twice, ``activate()``, ``revert()``: one registry throughout, each patch
    applied once per activation, and after each revert every attribute is
    the original object (``is``) and nothing was added or left behind."""
    proc, seen = run_child(
        """
        import importlib, logging
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        import transformers.modeling_layers, transformers.modeling_utils
        import hotfix                       # HOTFIX_DISABLE=1: imports, activates nothing
        from hotfix.registry import registry
        targets = sorted({t for p in registry.patches().values() for t in p.targets if t in sys.modules})

        def snapshot():
            snap = {}
            for name in targets:
                module = sys.modules[name]
                snap[name] = dict(vars(module))
                for attr, value in list(vars(module).items()):
                    if isinstance(value, type) and value.__module__ == name:
                        snap[name + ":" + attr] = dict(vars(value))
            return snap

        def changed(before):
            now = snapshot()
            diffs = []
            for key, attrs in before.items():
                for attr in set(attrs) | set(now[key]):
                    if attrs.get(attr, "<absent>") is not now[key].get(attr, "<absent>"):
                        diffs.append(key + "." + attr)
            return sorted(diffs)

        original = snapshot()
        del os.environ["HOTFIX_DISABLE"]
        import hotfix
        first_registry = registry
        importlib.reload(hotfix)
        out = {"targets": targets, "same_registry": sys.modules["hotfix.registry"].registry is first_registry}
        out["activate"] = [hotfix.activate(), hotfix.activate()]
        out["changed_1"] = changed(original)
        out["revert_1"] = [sorted(hotfix.revert()), hotfix.revert()]
        out["restored_1"] = changed(original)
        out["activate_2"] = [hotfix.activate(), hotfix.activate()]
        out["changed_2"] = changed(original)
        out["revert_2"] = sorted(hotfix.revert())
        out["restored_2"] = changed(original)
        report(**out)
        """,
        env={"HOTFIX_DISABLE": "1"},
    )
    assert TARGET in seen["targets"]
    assert seen["same_registry"] is True
    assert seen["activate"] == [True, True] and seen["activate_2"] == [True, True]
    assert f"{TARGET}:GradientCheckpointingLayer._gradient_checkpointing_func" in seen["changed_1"]
    assert seen["changed_2"] == seen["changed_1"]
    assert KEYWORD_PATCH in seen["revert_1"][0] and seen["revert_1"][1] == []
    assert seen["revert_2"] == seen["revert_1"][0]
    assert seen["restored_1"] == [] and seen["restored_2"] == []
    applied = [l for l in hotfix_lines(proc.stderr) if l.startswith(f"hotfix: applied {KEYWORD_PATCH} ")]
    assert len(applied) == 2, proc.stderr  # once per activation, not per activate() call


# ----------------------------------------------------------------------------
# 6. python -I with transformers
# ----------------------------------------------------------------------------
ISOLATED_PROBE = (
    "import sys, json, transformers.modeling_layers as ml; print(json.dumps({"
    "'hotfix': sorted(m for m in sys.modules if 'hotfix' in m), "
    "'patched': '_gradient_checkpointing_func' in ml.GradientCheckpointingLayer.__dict__}))"
)


def test_isolated_mode_disabled_with_transformers():
    """``python -I`` ignores PYTHON* variables but still processes
    site-packages and honours HOTFIX_DISABLE=1: importing transformers loads
    nothing of hotfix but the boot module, and patches nothing."""
    proc = run_python(["-I", "-c", ISOLATED_PROBE], env={"HOTFIX_DISABLE": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json_lines(proc.stdout)[0] == {"hotfix": ["_hotfix_boot"], "patched": False}


# ----------------------------------------------------------------------------
# 7. spawn-started processes and DataLoader workers
# ----------------------------------------------------------------------------
SPAWN_PROBE = """
    import os, sys

    def hotfix_modules():
        return sorted(m for m in sys.modules if "hotfix" in m)

    def probe(*_):
        before = hotfix_modules()
        armed = any(type(f).__name__ == "ActivateOnFirstImport" for f in sys.meta_path)
        import transformers.modeling_layers as ml
        return {"pid": os.getpid(), "before": before, "armed": armed, "after": hotfix_modules(),
                "patched": "_gradient_checkpointing_func" in ml.GradientCheckpointingLayer.__dict__}

    class ProbeDataset:
        def __len__(self):
            return 2
        def __getitem__(self, index):
            return probe()
"""


def test_spawned_processes_and_dataloader_workers_are_patched(tmp_path):
    """2 DataLoader workers started by multiprocessing's ``spawn`` method
    (fresh interpreters, so only the .pth can patch them) start with only the
    inert boot module of hotfix loaded (nothing imported, nothing to pay at
    start-up; bench/ measures the interpreter start), and are patched as soon
    as they import transformers."""
    (tmp_path / "spawn_probe.py").write_text(textwrap.dedent(SPAWN_PROBE))
    proc = run_python(
        ["-c", textwrap.dedent(
            """
            import json, os
            import torch.utils.data
            import transformers.modeling_layers
            import spawn_probe
            loader = torch.utils.data.DataLoader(spawn_probe.ProbeDataset(), batch_size=None, num_workers=2,
                                                 multiprocessing_context="spawn")
            workers = list(loader)
            print(json.dumps({"parent": os.getpid(), "workers": workers}))
            """
        )],
        pythonpath=[tmp_path], timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json_lines(proc.stdout)[0]
    processes = seen["workers"]
    assert len({p["pid"] for p in processes} | {seen["parent"]}) == 3
    for p in processes:
        assert p["before"] == ["_hotfix_boot"] and p["armed"] is True, p
        assert "hotfix" in p["after"] and p["patched"] is True, p


# ----------------------------------------------------------------------------
# 8. pip uninstall leaves nothing behind (throwaway venv, no torch)
# ----------------------------------------------------------------------------
def test_pip_uninstall_leaves_nothing(tmp_path):
    """In a fresh venv (not --system-site-packages): install the wheel built
    from this checkout, see the .pth / .start / boot module / package, run an
    interpreter (the boot runs), uninstall, and nothing of hotfix is left in
    site-packages (also no __pycache__ entry of the boot module)."""
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    # Built from a copy: setuptools writes build/ and *.egg-info into the source tree.
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("hotfix", "patches", "boot"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=240, cwd=str(tmp_path),
    )
    assert build.returncode == 0, build.stderr
    wheel = next(wheels.glob("hotfix_checkpoint-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=240)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    before = {p.name for p in site.iterdir()} | {p.name for p in (site / "__pycache__").glob("*")}
    assert not any("hotfix" in name for name in before)

    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=240)
    installed = {p.name for p in site.iterdir()}
    assert {"hotfix", "_hotfix_boot.py", "hotfix-checkpoint.pth", "hotfix-checkpoint.start"} <= installed
    run = subprocess.run([python, "-c", "import sys; print(sorted(m for m in sys.modules if 'hotfix' in m))"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "['_hotfix_boot']", run.stderr

    subprocess.run(pip + ["uninstall", "-y", "-q", "hotfix-checkpoint"], check=True, timeout=240)
    after = {p.name for p in site.iterdir()} | {p.name for p in (site / "__pycache__").glob("*")}
    assert after == before, sorted(after ^ before)
    run = subprocess.run([python, "-c", "import sys; print(sorted(m for m in sys.modules if 'hotfix' in m))"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "[]" and run.stderr == ""


# ----------------------------------------------------------------------------
# 9. What the .pth line does at every interpreter start
# ----------------------------------------------------------------------------
AUDIT_PROBE = """
    import os, sys, json   # os is loaded by site before any .pth line runs
    site_dir, pth = sys.argv[1], sys.argv[2]
    line = [l for l in open(pth).read().splitlines() if l.startswith("import")][0]
    sys.path.append(site_dir)
    WATCH = ("open", "socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
             "os.putenv", "os.unsetenv", "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod",
             "os.truncate", "os.symlink", "os.link", "shutil.", "ctypes.", "urllib.", "http.", "import")
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    events = []

    def hook(event, args):
        if event.startswith(WATCH):
            entry = [event, repr(args)[:300]]
            if event == "open":  # (path, mode, flags): io.open gives a mode, os.open flags
                path, mode, flags = args
                writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS)
                entry = [event, str(path), writes]
            events.append(entry)

    sys.addaudithook(hook)
    sitedir = site_dir
    exec(line)                              # exactly what site.addpackage does with the line
    ours = list(events)
    events.clear()
    import site
    site.main()                             # the whole start-up, every .pth of the venv
    print(json.dumps({"line": line, "ours": ours, "site": events}))
"""


def test_pth_line_touches_only_its_own_module():
    """Run the .pth line under ``sys.addaudithook`` (installed before site, via
    ``python -S``): the only events are read-only opens of ``_hotfix_boot``'s
    own file (loaded by location) and imports of already-loaded built-ins; no write, socket, subprocess, exec or
    environment change; the whole ``site.main()`` of the venv opens nothing
    for writing either."""
    pth = SITE / "hotfix-checkpoint.pth"
    proc = run_python(["-S", "-c", textwrap.dedent(AUDIT_PROBE), str(SITE), str(pth)], timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json_lines(proc.stdout)[0]
    # The boot module is loaded by its path beside the .pth (site's `sitedir`), never by a
    # name on sys.path that a user's own _hotfix_boot.py could shadow.
    assert 'os.path.join(sitedir, "_hotfix_boot.py")' in seen["line"] and seen["line"].endswith("m.boot()")
    ours = seen["ours"]
    imports = [entry[1] for entry in ours if entry[0] == "import"]
    assert all(args.startswith(("('_frozen_importlib", "('sys'")) for args in imports), ours
    opens = [entry for entry in ours if entry[0] == "open"]
    assert opens and all("_hotfix_boot" in path and not writes for _, path, writes in opens), ours
    assert {entry[0] for entry in ours} <= {"import", "open", "os.listdir", "os.scandir"}, ours
    for entry in seen["site"]:
        assert entry[0] in ("import", "open", "os.listdir", "os.scandir"), entry
        assert not (entry[0] == "open" and entry[2]), entry


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_interpreter_start_under_strace():
    """``python -c pass`` in the test venv (hotfix installed, boot armed) under
    strace: one execve (itself), no socket or connect, no write(), and every
    openat read-only."""
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=openat,open,creat,connect,socket,execve,write,sendto,unlink,rename,mkdir",
         sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60, cwd=str(REPO / "tests" / "_scratch"),
        env={k: v for k, v in os.environ.items() if not k.startswith(("HOTFIX_", "PYTHON"))},
    )
    assert proc.returncode == 0, proc.stderr
    calls = [l for l in proc.stderr.splitlines() if re.match(r"(\[pid\s+\d+\] )?\w+\(", l)]
    assert any("_hotfix_boot" in l for l in calls), "the boot module was not loaded"
    assert len([l for l in calls if "execve(" in l]) == 1, calls
    bad = [l for l in calls if re.search(r"\b(connect|socket|write|sendto|unlink|rename|mkdir|creat)\(", l)
           or ("openat(" in l and re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND", l))]
    assert bad == [], bad
