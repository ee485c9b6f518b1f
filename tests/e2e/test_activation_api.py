"""hotfix's Python API and plugins, in fresh interpreters: activate/revert, version gates, third-party
fixes from the entry-point group, known_patches(), status for a Whisper user, import cost.

The start-up path (the .pth hook, opt-outs, import order) is tests/e2e/test_activation.py.
"""

from __future__ import annotations

import textwrap
import tomllib

from conftest import CRASH, REPO, hotfix_lines, matrix_path, run_child, run_python

ATTRIBUTE = "_gradient_checkpointing_func"


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
    assert "transformers-checkpoint-layer-io" in seen["reverted"]
    assert not any(name.startswith("unsloth-zoo") for name in seen["reverted"])
    assert seen["absent_after_revert"] is True
    assert seen["layer_reads_own_function"] is True
    assert seen["after_revert"]["ok"] is False and CRASH in seen["after_revert"]["error"]
    assert seen["reactivated"] is True
    assert seen["descriptor_again"] == "CheckpointFunctionSlot"
    assert seen["trains_again"] == {"ok": True, "grads_match": True}
    assert seen["layer_state_untouched"] is True


# --------------------------------------------------------------------------- 7
def test_version_gate_per_mechanism():
    """On transformers 4.52.4 (GradientCheckpointingLayer is new; no layer uses it
    yet) ``hotfix status --verbose`` decides each mechanism from its own range:
    keyword tensors (from 4.52.0), nested and unused outputs apply, so the fix
    is installed on GradientCheckpointingLayer; the shared mapping (from 4.53.0)
    and the cache contents (from 4.56.0) are named, with the releases they are lost on
    upstream, but not marked ``[here]``.
    (A whole fix outside its range, "not needed here ... outside the affected
    range", is tested with unsloth-zoo 2026.10.9 in
    tests/versions/test_unsloth_zoo_fixes.py: every transformers fix starts at
    4.35, below the oldest release of tests/matrix.txt; below it, "NOT COVERED",
    in tests/unit/test_core_contracts.py.)"""
    proc, seen = run_child(
        """
        import runpy
        sys.argv = ["hotfix", "status", "--verbose"]
        try:
            runpy.run_module("hotfix", run_name="__main__", alter_sys=True)  # = python -m hotfix status --verbose
        except SystemExit as exc:
            code = exc.code
        import transformers
        import transformers.modeling_layers as ml
        report(code=code, version=transformers.__version__,
               descriptor=ATTRIBUTE in ml.GradientCheckpointingLayer.__dict__)
        """.replace("ATTRIBUTE", repr(ATTRIBUTE)),
        pythonpath=[matrix_path("transformers", "4.52.4")],
    )
    assert seen == {"code": 0, "version": "4.52.4", "descriptor": True}
    out = proc.stdout
    assert "transformers-checkpoint-layer-io: APPLIED to" in out
    older = "; not reached: transformers <4.35.0"  # below 4.35 status says NOT COVERED, not "not needed"
    for here in ("keyword-tensors (transformers >=4.52.0)", f"nested-outputs (transformers >=4.35.0{older})",
                 f"unused-outputs (transformers >=4.35.0{older})"):
        assert f"[here] {here}" in out, out
    lost = "; lost upstream: transformers "  # what transformers drops before any checkpoint function (hotfix.Lost)
    for elsewhere in (f"shared-mapping (transformers >=4.53.0{lost}>=5.0.0,<5.6.0{lost}>=5.5.0,<5.5.2)",
                      f"cache-contents (transformers >=4.56.0{lost}>=5.11.0,<5.12.0)"):
        assert elsewhere in out and f"[here] {elsewhere}" not in out, out
    assert "keyword-tensors: transformers 4.52.4 is in the affected range >=4.52.0" in out


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
    assert {"drifted-plugin", "failing-plugin", "good-plugin", "transformers-checkpoint-layer-io"} <= set(seen["patches"])
    assert "broken" not in seen["patches"]

    warnings = hotfix_lines(proc.stderr)
    broken = [w for w in warnings if "broken" in w]
    assert len(broken) == 1, proc.stderr  # named as another distribution's fix (a built-in one is "fix ...")
    assert broken[0].startswith("hotfix: third-party fix 'broken' (broken_plugin:patch) from distribution good-plugin "
                                "could not be loaded"), broken
    failing = [w for w in warnings if "failing-plugin" in w]
    assert len(failing) == 1 and "failed to apply" in failing[0] and "gave up half way" in failing[0]
    drifted = [w for w in warnings if "drifted-plugin" in w]
    assert len(drifted) == 1 and "skipped" in drifted[0] and "frobnicate is gone" in drifted[0]
    assert len(warnings) == 3, proc.stderr

    assert "good-plugin: APPLIED to plugin_target" in proc.stdout
    assert ("failed to load: third-party fix 'broken' (broken_plugin:patch) from distribution good-plugin"
            in proc.stdout), proc.stdout
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
    assert "transformers-checkpoint-layer-io" in seen["names"]


# --------------------------------------------------------------------------- 9
def test_status_for_a_whisper_user():
    """``python -m hotfix status`` on transformers 4.56.2 shows the patch
    applied and names the error message and model a user would search for."""
    proc = run_python(["-m", "hotfix", "status"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ("transformers-checkpoint-layer-io: APPLIED to transformers.modeling_utils, transformers.modeling_layers"
            "  (from hotfix-checkpoint)") in proc.stdout
    assert "active" in proc.stdout.splitlines()[0]
    fixes = [line for line in proc.stdout.splitlines() if line.startswith("  ")]
    with open(REPO / "pyproject.toml", "rb") as handle:
        declared = tomllib.load(handle)["project"]["entry-points"]["hotfix.patches"]
    assert len(fixes) == len(declared), proc.stdout  # one line per fix by default
    verbose = run_python(["-m", "hotfix", "status", "--verbose"], timeout=300)
    assert verbose.returncode == 0, verbose.stderr
    assert CRASH in verbose.stdout and "Whisper" in verbose.stdout
    assert "[here] keyword-tensors (transformers >=4.52.0)" in verbose.stdout, verbose.stdout


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
