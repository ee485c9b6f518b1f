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
from pathlib import Path

import pytest

from conftest import CRASH, FINDER_ARMED, hotfix_lines, json_lines, repair_notices, run_child, run_python

ATTRIBUTE = "_gradient_checkpointing_func"
FORBIDDEN_AT_START = ("wrapt", "importlib.metadata", "importlib.abc", "packaging", "torch", "transformers", "hotfix")

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
        _hotfix_boot = sys.modules["_hotfix_boot"]  # what the .pth line loaded
        import hotfix
        fix = importlib.import_module("hotfix.patches.transformers_checkpoint_layer_io")
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
    assert seen["fix"] == str(Path(site) / "hotfix" / "patches" / "transformers_checkpoint_layer_io.py")
    assert seen["patch_name"] == "transformers-checkpoint-layer-io"
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
    """HOTFIX_DISABLED_PATCHES=transformers-checkpoint-layer-io: the patch is not
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
        env={"HOTFIX_DISABLED_PATCHES": "transformers-checkpoint-layer-io"},
    )
    assert seen["hotfix_loaded"] is True
    assert seen["descriptor"] is False
    assert seen["step"]["ok"] is False and CRASH in seen["step"]["error"]
    assert "transformers-checkpoint-layer-io: opted out" in proc.stdout
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
        env={"HOTFIX_DISABLED_PATCHES": "nope,transformers_checkpoint_layer_io"},
    )
    assert seen["active"] is True
    warnings = hotfix_lines(proc.stderr)
    assert len(warnings) == 1, proc.stderr
    assert "nope" in warnings[0] and "known patches:" in warnings[0]
    assert "transformers-checkpoint-layer-io" in warnings[0].split("known patches:")[1]
    assert "transformers-checkpoint-layer-io: opted out" in proc.stdout


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


def test_boot_and_config_read_one_set_of_disable_values():
    """The "disable" spellings are defined once, in the start-up hook, and the hook's file runs once per process:
    hotfix.config reads them from the very module the .pth line loaded (issue 52, part 4: it used to import the
    file a second time as hotfix.startup.boot)."""
    proc, seen = run_child(
        """
        import hotfix.config, hotfix.startup.hook
        report(one=hotfix.config.TRUE_VALUES is sys.modules["_hotfix_boot"].TRUE_VALUES,
               same=hotfix.startup.hook.BOOT is sys.modules["_hotfix_boot"],
               second=sorted(name for name in sys.modules if name.endswith(".boot") or "boot_for" in name))
        """,
        env={"HOTFIX_DISABLE": "1"},
    )
    assert seen["one"] and seen["same"] and seen["second"] == [], seen


LISTINGS_PROBE = """
import sys  # loaded already: no import happens, the hook's finder is not asked
listed = []
sys.addaudithook(lambda event, args: listed.append(str(args[0])) if event in ("os.listdir", "os.scandir") else None)
import json  # the first top-level import of the process (d3ffe1e looked for third-party fixes here)
import packaging  # the first import outside the standard library: where the hook looks for them now
print(json.dumps({"listed": [path for path in listed if "big-folder" in path],
                  "armed": FINDER_ARMED}))
""".replace("FINDER_ARMED", FINDER_ARMED)


def test_the_first_import_lists_no_sys_path_folder_a_second_time(tmp_path):
    """Issue 40, defect 2: at the first import of every process the start-up hook listed every ``sys.path`` folder
    again (``os.listdir``), after Python's own listing: a folder of 100,000 files on PYTHONPATH cost 1.5x an
    ``import json`` (docs/performance.md).  It reads the listings Python's path finder keeps now: no folder Python
    listed during start-up is listed again."""
    folder = tmp_path / "big-folder"
    folder.mkdir()
    for i in range(200):
        (folder / f"data_{i}.bin").touch()
    proc = run_python(["-c", LISTINGS_PROBE], pythonpath=[folder], timeout=120)
    assert json_lines(proc.stdout) == [{"listed": [], "armed": True}], proc.stdout + proc.stderr
