"""Reliability at run time: racing threads on the first import, importlib.reload of a target,
exact restoration after repeated activate/revert, isolated mode with transformers (spawned
processes, DataLoader workers and installs: tests/e2e/test_reliability_processes.py).

Environment values, hostile plugins and a broken boot are tests/e2e/test_reliability.py.
"""

from __future__ import annotations

from conftest import CRASH, hotfix_lines, json_lines, plugin_dir, run_child, run_python

KEYWORD_PATCH = "transformers-checkpoint-layer-io"
TARGET = "transformers.modeling_layers"
TARGETS = ["transformers.modeling_utils", TARGET]  # the keyword fix's targets, in the order it declares them


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
    assert seen["applied"][KEYWORD_PATCH] == TARGETS
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
    plugins = plugin_dir(tmp_path, "reload-plugin", RELOAD_PLUGIN, "wrap-both = reload_plugin:patch\n")
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
    for target in TARGETS:  # once per target and activation, not per activate() call
        assert len([l for l in applied if f" to {target} " in l]) == 2, proc.stderr


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
