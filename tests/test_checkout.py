"""A source checkout behaves like the installed package (hotfix/checkout.py).

``patches/`` becomes ``hotfix.patches`` only through pyproject's package-dir
mapping at build time; run from the repository root, ``python -m hotfix``
used to import a hotfix with none of its fixes, and ``check-model
--compare-hotfix`` compared "without hotfix" against "hotfix with no fixes".
"""

from __future__ import annotations

import json

from conftest import REPO, TESTS, hotfix_lines, json_lines, run_python


def _patch_lines(output: str):
    return [line for line in output.splitlines() if line.startswith("  ") and line.strip().split(":")[0].count("-") >= 2
            and not line.startswith("    ")]


def test_status_from_checkout_root_equals_installed():
    from_checkout = run_python(["-m", "hotfix", "status"], cwd=REPO, timeout=300)
    installed = run_python(["-m", "hotfix", "status"], timeout=300)
    assert from_checkout.returncode == installed.returncode == 0, (from_checkout.stderr, installed.stderr)
    assert "hotfix/__init__.py" not in from_checkout.stderr
    checkout_lines, installed_lines = _patch_lines(from_checkout.stdout), _patch_lines(installed.stdout)
    assert len(checkout_lines) == 5, from_checkout.stdout
    assert checkout_lines == installed_lines, (from_checkout.stdout, installed.stdout)
    assert "failed to load" not in from_checkout.stdout


PROBE = r"""
import importlib.metadata as md, json, sys
md.entry_points = lambda **kwargs: []   # no installed metadata anywhere
sys.path.insert(0, sys.argv[1])
import hotfix, hotfix.patches
from hotfix.registry import registry
print(json.dumps({"hotfix": hotfix.__file__, "patches": hotfix.patches.__file__,
                  "known": sorted(hotfix.known_patches()), "errors": registry.load_errors}))
"""


def test_checkout_without_installed_metadata_reads_pyproject():
    proc = run_python(["-c", PROBE, str(REPO)], env={"HOTFIX_DISABLE": "1"}, timeout=120)
    seen = json_lines(proc.stdout)[0]
    assert seen["hotfix"] == str(REPO / "hotfix" / "__init__.py"), seen
    assert seen["patches"] == str(REPO / "patches" / "__init__.py"), seen
    assert seen["known"] == ["transformers-frozen-inputs", "transformers-input-grads-leaf", "transformers-keyword-tensors",
                             "unsloth-zoo-closure-tensors", "unsloth-zoo-offload-backward"], seen
    assert seen["errors"] == {}, seen


def test_compare_hotfix_from_checkout_root_compares_with_the_fixes():
    """Whisper, reentrant: without hotfix unsafe, with the checkout's hotfix safe."""
    proc = run_python(["-m", "hotfix", "check-model", "tiny_models:whisper", "--modes", "reentrant",
                       "--compare-hotfix", "--json"], cwd=REPO, env={"OMP_NUM_THREADS": "1"},
                      pythonpath=[TESTS], timeout=600)
    data = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert data["with hotfix"]["safe"] is True, data
    assert data["without hotfix (HOTFIX_DISABLE=1)"]["safe"] is False, data


def test_checkout_first_on_sys_path_is_what_auto_activation_loads():
    """From the repository root, ``import transformers`` (no ``import hotfix``):
    the start-up hook loads the checkout's hotfix, which is hotfix-checkpoint's
    own code, with no shadowing line."""
    probe = "import sys, transformers.modeling_layers as ml; print(sys.modules['hotfix'].__file__, " \
            "'_gradient_checkpointing_func' in ml.GradientCheckpointingLayer.__dict__)"
    proc = run_python(["-c", probe], cwd=REPO, timeout=120)
    assert proc.stdout.split() == [str(REPO / "hotfix" / "__init__.py"), "True"], proc.stderr
    assert hotfix_lines(proc.stderr) == [], proc.stderr
