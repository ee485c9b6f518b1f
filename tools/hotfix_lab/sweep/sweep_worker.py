"""The sweep's worker: runs inside an interpreter whose transformers is the release under test.

Builds each model type from its config class's defaults shrunk to a tiny size,
makes a dummy batch, runs ``check_model`` and prints one JSON line per model
(``{"start": type}`` before, ``{"row": {...}}`` after) for tools/hotfix_lab/sweep/sweep_models.py.
"""

from __future__ import annotations

import contextlib
import json
from typing import Dict, List, Optional

from hotfix_lab.sweep.sweep_inputs import dummy_batch, fit_image_tokens, sweep_loss, to_dtype
from hotfix_lab.sweep.sweep_shrink import shrink_config

SWEEP_MODES = ("reentrant", "non-reentrant")
#: checkpoint functions the sweep runs each recipe through, and the modes each one uses.
#: unsloth: unsloth-zoo's UnslothCheckpointFunction swapped in for torch's CheckpointFunction
#: (its own patch_unsloth_smart_gradient_checkpointing, loaded on CPU by tools/hotfix_lab/infra/zoo_loader.py);
#: it serves reentrant checkpointing only (non-reentrant never calls CheckpointFunction).
FUNCTION_MODES = {"torch": SWEEP_MODES, "unsloth": ("reentrant",)}



def _model_types(only: Optional[List[str]], with_variants: bool = False):
    """(model type, base class name, config class name) of the release; with_variants also yields
    ``<type>+<variant>`` for each variant of ``sweep_families`` (when its type is selected)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    from hotfix_lab.sweep import sweep_families

    variants = sweep_families.variants() if with_variants else {}
    for model_type, class_name in MODEL_MAPPING_NAMES.items():
        if isinstance(class_name, (list, tuple)):
            class_name = class_name[0]
        names = [model_type] + [f"{model_type}+{v}" for v in variants.get(model_type, {})]
        for name in names:
            if not only or name in only or (name != model_type and model_type in only):
                yield name, class_name, CONFIG_MAPPING_NAMES.get(model_type)


def _short(exc: BaseException) -> str:
    from hotfix.diagnostics.compare import short_error

    return short_error(exc, limit=160)


def build(model_type: str, class_name: str, config_name: str):
    """(model, config, batch) of a model type, from its config class's defaults shrunk small.

    ``sweep_families`` adds what the generic shrink and inputs cannot guess for a family; callers
    ask ``sweep_families.unbuildable`` first.
    """
    import warnings

    import torch
    import transformers

    from hotfix_lab.sweep import sweep_families

    model_type, variant = sweep_families.split_variant(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls = getattr(transformers, class_name)
        make_config = sweep_families.factory(model_type) or (lambda config_class: config_class())
        config = shrink_config(make_config(getattr(transformers, config_name)))
        for fix in (sweep_families.config_fix(model_type), variant):
            if fix is not None:
                fix(config)
        torch.manual_seed(0)
        model = cls(config).train()
        make_inputs = sweep_families.inputs_for(model_type)
        if make_inputs is not None:
            return model, config, make_inputs(model, config, torch.Generator().manual_seed(0))
        return model, config, fit_image_tokens(model, config, dummy_batch(model, config))


ADAPTERS_NEVER_RUN = ("the LoRA adapters never reach the loss: none gets a gradient even without checkpointing, "
                      "so there is nothing to compare")


def _adapters_never_run(report) -> bool:
    """A LoRA recipe with nothing to compare: the step without checkpointing gives no adapter a gradient
    (VideoMAE 4.x calls ``F.linear(x, self.query.weight, ...)``, WavLM hands the projections' weights to
    ``F.multi_head_attention_forward``, MRA without its CUDA kernel returns zeros for attention), so
    "equal" would only mean None == None (or, with nothing else trainable, the loss does not require grad)."""
    if report.reference.status == "reference":
        return bool(report.parameters) and len(report.without_gradient) == len(report.parameters)
    return "does not require grad without checkpointing" in (report.reference.error or "")


@contextlib.contextmanager
def _default_dtype(dtype):
    """torch's default dtype set to ``dtype`` (None: unchanged) for the steps only: tensors a forward makes
    itself (masks, positions, noise) then follow a float64 model, while the model and its batch are still
    built as in float32 (a batch fitted to the model, e.g. its image placeholders, by a float32 forward)."""
    import torch

    before = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def check_one(model_type: str, class_name: str, config_name: Optional[str], memory_limit: int, time_limit: float,
              recipes=("full",), modes=SWEEP_MODES, dtype: str = "float32") -> List[Dict]:
    """One row per recipe: pass / FAIL / n/a / could-not-build / could-not-run / no-checkpointing.

    ``dtype="float64"``: the model and the batch's float tensors in double precision (the checker's tolerance
    follows: 1e-10), to tell rounding (shrinks by ~1e-9) from a real difference (does not)."""
    import warnings

    import torch
    import transformers

    from hotfix.diagnostics.checker import check_model
    from hotfix_lab.sweep.sweep_recipes import NotApplicable, apply

    def row(recipe, **fields):
        return dict({"model_type": model_type, "class": class_name, "recipe": recipe}, **fields)

    from hotfix_lab.sweep import sweep_families

    reason = sweep_families.unbuildable(model_type)
    if reason:
        return [row(r, result="could-not-build", detail=reason) for r in recipes]
    try:
        declares = getattr(getattr(transformers, class_name), "supports_gradient_checkpointing", False)
    except BaseException as exc:  # some modules raise ImportError/SystemExit for missing extras
        return [row(r, result="could-not-build", detail=_short(exc)) for r in recipes]
    if not declares:
        return [row(r, result="no-checkpointing", detail="supports_gradient_checkpointing is False") for r in recipes]
    rows = []
    for recipe in recipes:
        try:
            model, config, batch = build(model_type, class_name, config_name)
            if dtype == "float64":  # before the recipe: LoRA adapters follow their base layer's dtype
                model, batch = model.double(), to_dtype(batch, torch.float64)
                if hasattr(model, "set_experts_implementation"):  # 5.x MoE default grouped_mm has no float64 kernel
                    model.set_experts_implementation("eager")
        except BaseException as exc:
            rows.append(row(recipe, result="could-not-build", detail=_short(exc)))
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = apply(model, recipe)
        except NotApplicable as exc:
            rows.append(row(recipe, result="n/a", detail=str(exc)))
            continue
        except BaseException as exc:
            rows.append(row(recipe, result="could-not-build", detail="recipe: " + _short(exc)))
            continue
        with warnings.catch_warnings(), _default_dtype(torch.float64 if dtype == "float64" else None):
            warnings.simplefilter("ignore")
            report = check_model(model, batch, loss_fn=sweep_loss, modes=modes, memory_limit=memory_limit, time_limit=time_limit,
                                 hard_exit=True, grace=30)
        out = row(recipe, parameters=len(report.parameters))
        if recipe.startswith("lora") and _adapters_never_run(report):
            out.update(result="n/a", detail=ADAPTERS_NEVER_RUN)
        elif report.reference.status != "reference":
            out.update(result="could-not-run", detail=report.reference.error)
        elif not report.supported:
            out.update(result="no-checkpointing", detail=report.modes[0].error if report.modes else "")
        else:
            out["modes"] = {m.mode: {"status": m.status, "summary": m.summary(), "missing": len(m.missing),
                                     "wrong": len(m.wrong), "unexpected": len(m.unexpected), "total": m.total,
                                     "saved_bytes": m.saved_bytes, "max_error": m.max_error}
                            for m in report.modes}
            out["result"] = "pass" if report.safe else "FAIL"
        rows.append(out)
        del model, batch
    return rows


def census_main() -> int:
    """Which model types of this release declare supports_gradient_checkpointing (classes imported, none built)."""
    import warnings

    import transformers

    transformers.logging.set_verbosity_error()
    found: Dict[str, List[str]] = {"checkpointable": [], "not": [], "unknown": []}
    for model_type, class_name, _ in _model_types(None):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                declares = getattr(getattr(transformers, class_name), "supports_gradient_checkpointing", False)
        except BaseException:  # missing extras (timm, PIL): counted as checkpointable below, never as checked
            found["unknown"].append(model_type)
            continue
        found["checkpointable" if declares else "not"].append(model_type)
    found["checkpointable"] += found["unknown"]  # the honest denominator: what could not be imported counts
    print(json.dumps({"census": found}), flush=True)
    return 0


def worker_main(args) -> int:
    import torch

    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    from hotfix.registry import registry

    only = args.models.split(",") if args.models else None
    skip = set(args.skip.split(",")) if args.skip else set()
    recipes = args.recipes.split(",")
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "hotfix": registry.active,
            "function": args.function}
    if args.function == "unsloth":
        from hotfix_lab.infra.zoo_loader import install_unsloth_swap, load_release

        install_unsloth_swap(load_release())  # asserts torch's CheckpointFunction is now unsloth's
        from importlib.metadata import version

        from hotfix.diagnostics.modes import installed_checkpoint

        meta.update(unsloth_zoo=version("unsloth_zoo"), checkpoint_function=installed_checkpoint())
    for model_type, class_name, config_name in _model_types(only, with_variants=True):
        if model_type in skip:
            continue
        print(json.dumps({"start": model_type}), flush=True)
        base = {"model_type": model_type, "class": class_name}
        if config_name is None:
            rows = [dict(base, recipe=r, result="could-not-build", detail="no config") for r in recipes]
        else:
            try:
                rows = check_one(model_type, class_name, config_name, args.memory_limit, args.time_limit, recipes,
                                 FUNCTION_MODES[args.function], args.dtype)
            except BaseException as exc:
                rows = [dict(base, recipe=r, result="could-not-run", detail=_short(exc)) for r in recipes]
        for row in rows:
            row.update(meta)
            print(json.dumps({"row": row}), flush=True)
        print(json.dumps({"finished": model_type}), flush=True)
    print(json.dumps({"done": True}), flush=True)
    return 0
