"""How hotfix switches itself on and off, as a user meets it.

Every test runs its scenario in a fresh interpreter of the test venv
(``run_python``), where hotfix is installed from the wheel and its ``.pth``
start-up hook is live: what happens at interpreter start, on the first
``import transformers``, on ``import hotfix`` and under the opt-out variables
can only be seen from a new process.  Child scripts print one JSON line of
observations; the assertions are made here.

Importing torch + transformers costs several seconds per child, so each child
that needs them checks several related things at once.
"""

from __future__ import annotations

import os
import re
import sysconfig
import textwrap
from pathlib import Path

import pytest

from conftest import hotfix_lines, json_lines, matrix_path, repair_notices, run_python

ATTRIBUTE = "_gradient_checkpointing_func"
CRASH = "Trying to backward through the graph a second time"
FORBIDDEN_AT_START = ("wrapt", "importlib.metadata", "importlib.abc", "packaging", "torch", "transformers", "hotfix")

# Prepended to child scripts that train.  It must not import hotfix: several
# children prove that hotfix is (or is not) loaded by transformers' import alone.
# The model and the gradient comparison come from hotfix/diagnostics/, loaded by
# path through tools/ (tiny_models, standalone), which import no hotfix.
PRELUDE = textwrap.dedent(
    '''
    import json, os, sys

    def boot_armed():
        """Is the .pth finder waiting for transformers in sys.meta_path?"""
        return any(type(f).__name__ == "ActivateOnFirstImport" for f in sys.meta_path)

    def tiny_whisper(seed=0):
        import tiny_models  # tools/ is on the child's PYTHONPATH

        return tiny_models.whisper(seed)

    def compare():
        import standalone

        return standalone.load("compare")  # hotfix's one comparison rule, without importing hotfix

    def grads(model):
        return compare().collect_grads(model)

    def reference_grads(model, batch):
        """Gradients of one step without checkpointing (call before enabling it)."""
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        return grads(model)

    def step(model, batch, reference=None):
        """One training step: {"ok": True[, "grads_match": ...]} or {"ok": False, "error": ...}."""
        model.zero_grad(set_to_none=True)
        try:
            model(**batch).loss.backward()
        except Exception as exc:
            return {"ok": False, "error": compare().short_error(exc)}
        result = {"ok": True}
        if reference is not None:
            result["grads_match"] = compare().compare_grads(reference, grads(model)).ok
        return result

    def layer_checkpoint_function(model):
        """What transformers stored on a layer (instance __dict__, not the descriptor)."""
        return model.model.decoder.layers[0].__dict__.get("_gradient_checkpointing_func")

    def report(**values):
        print(json.dumps(values), flush=True)
    '''
)


def run_child(body: str, **kwargs):
    """Run PRELUDE + body in a fresh interpreter; return (process, first JSON line)."""
    proc = run_python(["-c", PRELUDE + textwrap.dedent(body)], timeout=300, **kwargs)
    assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = json_lines(proc.stdout)
    assert lines, f"child printed no JSON:\n{proc.stdout}\n{proc.stderr}"
    return proc, lines[0]


# A user script that never mentions hotfix: the .pth hook alone must act.
USER_SCRIPT = """
    import transformers
    hotfix_loaded = "hotfix" in sys.modules
    model, batch = tiny_whisper()
    reference = reference_grads(model, batch)
    model.gradient_checkpointing_enable()
    report(
        hotfix_loaded=hotfix_loaded,
        use_reentrant=layer_checkpoint_function(model).keywords.get("use_reentrant"),
        transformers=transformers.__version__,
        step=step(model, batch, reference),
        hotfix_modules=sorted(m for m in sys.modules if m == "hotfix" or m.startswith("hotfix.")),
    )
"""


@pytest.fixture(scope="module")
def user_script_default():
    return run_child(USER_SCRIPT)


@pytest.fixture(scope="module")
def user_script_disabled():
    return run_child(USER_SCRIPT, env={"HOTFIX_DISABLE": "1"})


# --------------------------------------------------------------------------- 1
def test_installed_wheel_is_under_test():
    """The tests exercise the wheel as users install it, not the source tree:
    hotfix and the boot module come from site-packages, both start-up files sit
    at its root, the fixes ship as ``hotfix.patches`` and no generic top-level
    ``patches`` package leaks into users' environments."""
    proc, seen = run_child(
        """
        import importlib, sysconfig
        site = os.path.realpath(sysconfig.get_paths()["purelib"])
        import _hotfix_boot
        import hotfix
        fix = importlib.import_module("hotfix.patches.transformers_keyword_tensors")
        try:
            import patches
            stray = getattr(patches, "__file__", repr(patches))
        except ImportError:
            stray = None
        report(
            site=site,
            hotfix=os.path.realpath(hotfix.__file__),
            boot=os.path.realpath(_hotfix_boot.__file__),
            fix=os.path.realpath(fix.__file__),
            patch_name=fix.patch.name,
            pth=os.path.isfile(os.path.join(site, "hotfix-checkpoint.pth")),
            start=os.path.isfile(os.path.join(site, "hotfix-checkpoint.start")),
            stray_patches=stray,
        )
        """,
        env={"HOTFIX_DISABLE": "1"},
    )
    site = seen["site"]
    assert site == os.path.realpath(sysconfig.get_paths()["purelib"])  # the test venv's
    assert seen["hotfix"] == str(Path(site) / "hotfix" / "__init__.py")
    assert seen["boot"] == str(Path(site) / "_hotfix_boot.py")
    assert seen["fix"] == str(Path(site) / "hotfix" / "patches" / "transformers_keyword_tensors.py")
    assert seen["patch_name"] == "transformers-keyword-tensors"
    assert seen["pth"] and seen["start"]
    assert seen["stray_patches"] is None, f"a top-level 'patches' package is importable: {seen['stray_patches']}"


# --------------------------------------------------------------------------- 2
def test_pth_activates_on_transformers_import(user_script_default):
    """A script that never imports hotfix trains Whisper with the default
    (reentrant) checkpointing of 4.56.2: the .pth hook loaded hotfix during
    ``import transformers`` and the gradients equal those without checkpointing."""
    proc, seen = user_script_default
    assert seen["transformers"] == "4.56.2"
    assert seen["use_reentrant"] is True
    assert seen["hotfix_loaded"] is True
    assert seen["step"] == {"ok": True, "grads_match": True}
    assert hotfix_lines(proc.stderr) == []
    assert len(repair_notices(proc.stderr)) == 1, proc.stderr  # the one default line: what was repaired


def test_hotfix_disable_reproduces_the_crash(user_script_disabled):
    """With HOTFIX_DISABLE=1 the same script hits the upstream bug, and hotfix
    is never imported."""
    proc, seen = user_script_disabled
    assert seen["hotfix_loaded"] is False
    assert seen["hotfix_modules"] == []
    assert seen["step"]["ok"] is False
    assert CRASH in seen["step"]["error"]


# --------------------------------------------------------------------------- 3
# HOTFIX_DISABLE=1 keeps the .pth hook out of the way; the child removes it
# before its own `import hotfix`, so the explicit import is what activates.
def test_import_hotfix_before_transformers():
    """``import hotfix`` at the top of a script, before transformers, fixes training."""
    proc, seen = run_child(
        """
        armed = boot_armed()
        del os.environ["HOTFIX_DISABLE"]
        import hotfix
        import transformers
        model, batch = tiny_whisper()
        reference = reference_grads(model, batch)
        model.gradient_checkpointing_enable()
        report(armed=armed, active=hotfix.activate(), step=step(model, batch, reference))
        """,
        env={"HOTFIX_DISABLE": "1"},
    )
    assert seen["armed"] is False  # the boot really stood aside
    assert seen["active"] is True
    assert seen["step"] == {"ok": True, "grads_match": True}


def test_import_hotfix_after_model_is_built():
    """A notebook that built the model and enabled checkpointing before
    ``import hotfix`` trains correctly afterwards: layers built earlier are fixed too."""
    proc, seen = run_child(
        """
        import transformers
        model, batch = tiny_whisper()
        reference = reference_grads(model, batch)
        model.gradient_checkpointing_enable()
        loaded_before = "hotfix" in sys.modules
        del os.environ["HOTFIX_DISABLE"]
        import hotfix
        report(loaded_before=loaded_before, active=hotfix.activate(), step=step(model, batch, reference))
        """,
        env={"HOTFIX_DISABLE": "1"},
    )
    assert seen["loaded_before"] is False
    assert seen["active"] is True
    assert seen["step"] == {"ok": True, "grads_match": True}


# --------------------------------------------------------------------------- 4
OPT_OUT_PROBE = """
    armed = boot_armed()
    import hotfix
    from hotfix.registry import registry
    report(armed=armed, active=registry.active)
"""


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_hotfix_disable_values_that_disable(value):
    """HOTFIX_DISABLE=1/true/yes/on (any case, any spaces) stops the start-up
    hook and ``import hotfix`` alike, silently."""
    proc, seen = run_child(OPT_OUT_PROBE, env={"HOTFIX_DISABLE": value})
    assert seen == {"armed": False, "active": False}
    assert hotfix_lines(proc.stderr) == []


@pytest.mark.parametrize("value", ["0", "false", ""])
def test_hotfix_disable_values_that_enable(value):
    """HOTFIX_DISABLE=0/false/empty leaves hotfix on, silently."""
    proc, seen = run_child(OPT_OUT_PROBE, env={"HOTFIX_DISABLE": value})
    assert seen == {"armed": True, "active": True}
    assert hotfix_lines(proc.stderr) == []


def test_hotfix_disable_value_not_understood():
    """HOTFIX_DISABLE=maybe is not understood: one warning naming the variable,
    and hotfix stays off (the documented fallback of hotfix/config.py)."""
    proc, seen = run_child(OPT_OUT_PROBE, env={"HOTFIX_DISABLE": "maybe"})
    assert seen["armed"] is True  # the boot leaves values it does not know to hotfix.config
    assert seen["active"] is False
    warnings = hotfix_lines(proc.stderr)
    assert len(warnings) == 1, proc.stderr
    assert "HOTFIX_DISABLE" in warnings[0] and "maybe" in warnings[0]


def test_disabled_patches_opts_one_patch_out():
    """HOTFIX_DISABLED_PATCHES=transformers-keyword-tensors: the patch is not
    applied (the crash reproduces) and ``hotfix status`` says "opted out"."""
    proc, seen = run_child(
        """
        import transformers
        import transformers.modeling_layers as ml
        model, batch = tiny_whisper()
        model.gradient_checkpointing_enable()
        report(
            hotfix_loaded="hotfix" in sys.modules,
            descriptor=ATTRIBUTE in ml.GradientCheckpointingLayer.__dict__,
            step=step(model, batch),
        )
        from hotfix.cli import main  # what the `hotfix` command runs
        main(["status"])
        """.replace("ATTRIBUTE", repr(ATTRIBUTE)),
        env={"HOTFIX_DISABLED_PATCHES": "transformers-keyword-tensors"},
    )
    assert seen["hotfix_loaded"] is True
    assert seen["descriptor"] is False
    assert seen["step"]["ok"] is False and CRASH in seen["step"]["error"]
    assert "transformers-keyword-tensors: opted out" in proc.stdout
    assert hotfix_lines(proc.stderr) == []


def test_disabled_patches_unknown_name_warns():
    """An unknown name in HOTFIX_DISABLED_PATCHES gets a warning listing the
    known patches; the known one, spelt with underscores, is still opted out."""
    proc, seen = run_child(
        """
        import hotfix
        from hotfix.registry import registry
        report(active=registry.active, opted_out=sorted(registry.settings.disabled_patches))
        from hotfix.cli import main
        main(["status", "--no-import"])
        """,
        env={"HOTFIX_DISABLED_PATCHES": "nope,transformers_keyword_tensors"},
    )
    assert seen["active"] is True
    warnings = hotfix_lines(proc.stderr)
    assert len(warnings) == 1, proc.stderr
    assert "nope" in warnings[0] and "known patches:" in warnings[0]
    assert "transformers-keyword-tensors" in warnings[0].split("known patches:")[1]
    assert "transformers-keyword-tensors: opted out" in proc.stdout


# --------------------------------------------------------------------------- 5
def imported_modules(importtime_stderr: str):
    """Module names from ``-X importtime`` output."""
    names = []
    for line in importtime_stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", line)
        if match:
            names.append(match.group(1))
    return names


def forbidden(names):
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN_AT_START))


def test_startup_hook_is_cheap():
    """Every interpreter in the venv (pip, DataLoader workers...) runs the .pth
    line: it loads only ``_hotfix_boot`` (by its path), never hotfix, wrapt, packaging,
    importlib.metadata/abc, torch or transformers."""
    proc = run_python(["-X", "importtime", "-c", "import sys; print('_hotfix_boot' in sys.modules)"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = imported_modules(proc.stderr)
    assert "site" in names, proc.stderr  # the parser understood the output
    assert proc.stdout.strip() == "True"  # loaded by location, so not in -X importtime's list
    assert forbidden(names) == []


def test_no_site_and_isolated_mode():
    """``python -S`` never runs the hook; ``python -I`` still processes
    site-packages, so it loads the boot module, and nothing more of hotfix."""
    probe = (
        "import sys, json; print(json.dumps({'hotfix': sorted(m for m in sys.modules if 'hotfix' in m), "
        f"'forbidden': sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN_AT_START!r} "
        "or m.startswith(('importlib.metadata', 'importlib.abc')))}))"
    )
    no_site = run_python(["-S", "-c", probe], timeout=120)
    assert json_lines(no_site.stdout) == [{"hotfix": [], "forbidden": []}], no_site.stderr
    isolated = run_python(["-I", "-c", probe], timeout=120)
    assert json_lines(isolated.stdout) == [{"hotfix": ["_hotfix_boot"], "forbidden": []}], isolated.stderr


def test_disabled_boot_loads_no_hotfix(user_script_disabled):
    """With HOTFIX_DISABLE=1 not even ``import transformers`` loads hotfix (only the
    inert boot module is there)."""
    proc, seen = user_script_disabled
    assert seen["hotfix_loaded"] is False and seen["hotfix_modules"] == []


def test_boot_and_config_agree_on_disable_values():
    """The boot module's copy of the "disable" spellings equals hotfix.config's."""
    proc, seen = run_child(
        """
        import _hotfix_boot, hotfix.config
        report(boot=sorted(_hotfix_boot.DISABLE_VALUES), config=sorted(hotfix.config.TRUE_VALUES))
        """,
        env={"HOTFIX_DISABLE": "1"},
    )
    assert seen["boot"] == seen["config"]


# --------------------------------------------------------------------------- 6
def test_activate_is_idempotent_and_revert_restores():
    """On one model object: activate twice changes nothing, revert puts the
    class back exactly as transformers made it (the crash returns), and
    activate again fixes training again."""
    proc, seen = run_child(
        """
        import hotfix
        import transformers.modeling_layers as ml
        Layer = ml.GradientCheckpointingLayer
        first = Layer.__dict__.get(ATTRIBUTE)
        activated = [hotfix.activate(), hotfix.activate()]
        model, batch = tiny_whisper()
        reference = reference_grads(model, batch)
        model.gradient_checkpointing_enable()
        stored = layer_checkpoint_function(model)
        out = dict(
            descriptor=type(first).__name__,
            activated=activated,
            same_descriptor=Layer.__dict__.get(ATTRIBUTE) is first,
            trains=step(model, batch, reference),
        )
        out["reverted"] = hotfix.revert()
        out["absent_after_revert"] = ATTRIBUTE not in Layer.__dict__
        out["layer_reads_own_function"] = model.model.decoder.layers[0]._gradient_checkpointing_func is stored
        out["after_revert"] = step(model, batch)
        out["reactivated"] = hotfix.activate()
        out["descriptor_again"] = type(Layer.__dict__.get(ATTRIBUTE)).__name__
        out["trains_again"] = step(model, batch, reference)
        out["layer_state_untouched"] = layer_checkpoint_function(model) is stored
        report(**out)
        """.replace("ATTRIBUTE", repr(ATTRIBUTE)),
    )
    assert seen["descriptor"] == "CheckpointFunctionSlot"
    assert seen["activated"] == [True, True]
    assert seen["same_descriptor"] is True
    assert seen["trains"] == {"ok": True, "grads_match": True}
    # Only what was applied is reverted (the zoo patches never saw their target here).
    assert "transformers-keyword-tensors" in seen["reverted"]
    assert not any(name.startswith("unsloth-zoo") for name in seen["reverted"])
    assert seen["absent_after_revert"] is True
    assert seen["layer_reads_own_function"] is True
    assert seen["after_revert"]["ok"] is False and CRASH in seen["after_revert"]["error"]
    assert seen["reactivated"] is True
    assert seen["descriptor_again"] == "CheckpointFunctionSlot"
    assert seen["trains_again"] == {"ok": True, "grads_match": True}
    assert seen["layer_state_untouched"] is True


# --------------------------------------------------------------------------- 7
def test_version_gate_outside_affected_range():
    """On transformers 4.52.4 (before the bug) ``hotfix status`` says the patch
    is not needed, and nothing is installed on GradientCheckpointingLayer."""
    proc, seen = run_child(
        """
        import runpy
        sys.argv = ["hotfix", "status"]
        try:
            runpy.run_module("hotfix", run_name="__main__", alter_sys=True)  # = python -m hotfix status
        except SystemExit as exc:
            code = exc.code
        import transformers
        import transformers.modeling_layers as ml
        report(code=code, version=transformers.__version__,
               descriptor=ATTRIBUTE in ml.GradientCheckpointingLayer.__dict__)
        """.replace("ATTRIBUTE", repr(ATTRIBUTE)),
        pythonpath=[matrix_path("transformers", "4.52.4")],
    )
    assert seen == {"code": 0, "version": "4.52.4", "descriptor": False}
    assert "transformers-keyword-tensors: not needed here" in proc.stdout
    assert "outside the affected range" in proc.stdout


# --------------------------------------------------------------------------- 8
PLUGINS = {
    "plugin_target.py": "value = 'original'\n",
    "broken_plugin.py": "raise ImportError('broken_plugin cannot be imported')\n",
    "good_plugin.py": textwrap.dedent(
        """
        from hotfix import Patch

        class Good(Patch):
            name = "good-plugin"
            targets = ("plugin_target",)
            affected = {}
            symptom = "plugin_target.value is wrong"

            def _apply(self, module):
                self.replace(module, "value", "fixed by good-plugin")

        class Failing(Patch):
            name = "failing-plugin"
            targets = ("plugin_target",)

            def _apply(self, module):
                self.replace(module, "failing_touched", True)
                raise RuntimeError("failing-plugin gave up half way")

        class Drifted(Patch):
            name = "drifted-plugin"
            targets = ("plugin_target",)

            def drift(self, module):
                return "plugin_target.frobnicate is gone"

            def _apply(self, module):
                self.replace(module, "drifted_touched", True)

        patch = Good()
        failing = Failing()
        drifted = Drifted()
        """
    ),
    "good_plugin-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: good-plugin\nVersion: 1.0\n",
    "good_plugin-1.0.dist-info/entry_points.txt": textwrap.dedent(
        """
        [hotfix.patches]
        good = good_plugin:patch
        broken = broken_plugin:patch
        failing = good_plugin:failing
        drifted = good_plugin:drifted
        """
    ),
}


def test_plugins_from_entry_point_group(tmp_path):
    """A third-party distribution adds patches through the ``hotfix.patches``
    entry-point group: a good one is applied on its target's import; one that
    cannot be imported, one whose ``_apply`` raises and one whose target drifted
    each cost one warning line and nothing else: the program goes on."""
    for relative, text in PLUGINS.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    proc, seen = run_child(
        """
        import hotfix, plugin_target
        from hotfix.registry import registry
        report(
            value=plugin_target.value,
            failing_touched=hasattr(plugin_target, "failing_touched"),
            drifted_touched=hasattr(plugin_target, "drifted_touched"),
            patches=sorted(registry.patches()),
        )
        from hotfix.cli import main
        main(["status", "--no-import"])
        """,
        pythonpath=[tmp_path],
    )
    assert seen["value"] == "fixed by good-plugin"
    assert seen["failing_touched"] is False  # the half-done change was rolled back
    assert seen["drifted_touched"] is False
    assert {"drifted-plugin", "failing-plugin", "good-plugin", "transformers-keyword-tensors"} <= set(seen["patches"])
    assert "broken" not in seen["patches"]

    warnings = hotfix_lines(proc.stderr)
    broken = [w for w in warnings if "broken" in w]
    assert len(broken) == 1 and "broken_plugin" in broken[0], proc.stderr
    failing = [w for w in warnings if "failing-plugin" in w]
    assert len(failing) == 1 and "failed to apply" in failing[0] and "gave up half way" in failing[0]
    drifted = [w for w in warnings if "drifted-plugin" in w]
    assert len(drifted) == 1 and "skipped" in drifted[0] and "frobnicate is gone" in drifted[0]
    assert len(warnings) == 3, proc.stderr

    assert "good-plugin: APPLIED to plugin_target" in proc.stdout
    assert "plugin 'broken' failed to load" in proc.stdout
    assert "drifted-plugin: skipped, target changed" in proc.stdout


def test_public_known_patches_function_survives_activation():
    """``hotfix.known_patches()`` still lists the patches after ``import hotfix``
    has activated them (a function named ``patches`` would be hidden by the
    ``hotfix.patches`` subpackage the import system binds on the package)."""
    proc, seen = run_child(
        """
        import hotfix
        report(kind=type(hotfix.known_patches).__name__, names=sorted(hotfix.known_patches()))
        """
    )
    assert seen["kind"] == "function"
    assert "transformers-keyword-tensors" in seen["names"]


# --------------------------------------------------------------------------- 9
def test_status_for_a_whisper_user():
    """``python -m hotfix status`` on transformers 4.56.2 shows the patch
    applied and names the error message and model a user would search for."""
    proc = run_python(["-m", "hotfix", "status"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "transformers-keyword-tensors: APPLIED to transformers.modeling_layers" in proc.stdout
    assert CRASH in proc.stdout
    assert "Whisper" in proc.stdout
    assert "active" in proc.stdout.splitlines()[0]


def test_import_hotfix_does_not_import_torch():
    """Loading every built-in patch (what activation does) imports no torch:
    a tokenizer-only user with transformers but no torch gets no warnings."""
    proc, seen = run_child(
        """
        import sys
        import hotfix
        report(torch=sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
               patches=sorted(hotfix.known_patches()))
        """
    )
    assert seen["torch"] == []
    assert len(seen["patches"]) >= 4
    assert hotfix_lines(proc.stderr) == []
