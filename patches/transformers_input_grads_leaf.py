"""transformers: ``enable_input_require_grads()``'s hook makes a leaf the model changes in place, or raises on a tuple.

What breaks: the hook calls ``output.requires_grad_(True)`` on the input embeddings' output.
With frozen embeddings (LoRA) that output becomes a leaf needing grad, and GIT, BLIP's text
model, BLT and CSM change it in place right after: "a leaf Variable that requires grad is
being used in an in-place operation".  From 5.0 ``gradient_checkpointing_enable()`` calls the
method itself, so merely turning checkpointing on crashes.  Embeddings that return a tuple
(Swin family, Data2Vec-vision, Hiera, TimeSformer) make the hook raise AttributeError.

How this fixes it: ``enable_input_require_grads`` is wrapped; each hook it registers is
replaced in its module's hook table by a plain function around it (the handle still removes
it) that hands on ``output.clone()`` where upstream's hook left a leaf needing grad, and for a
tuple makes its floating-point tensors require grad the same way.  After ``revert()`` the
hooks already in a model behave as upstream's.  docs/fixes/transformers-input-grads-leaf.md.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from hotfix.patch import Mechanism, Patch
from hotfix.patches._checkpoint_slot import code_objects

METHOD = "enable_input_require_grads"
#: where upstream keeps the handles: one (4.x, and 5.x "for BC") or all (5.x)
HANDLE_ATTRIBUTES = ("_require_grads_hooks", "_require_grads_hook")


def _non_leaf_hook(upstream_hook: Any, applied: Callable[[], bool]) -> Callable:
    """Upstream's ``make_inputs_require_grads(module, input, output)`` hook, handing on a copy where it made a leaf.

    A plain function, not a wrapt proxy: torch.compile traces forward hooks, and dynamo cannot trace a
    ``FunctionWrapper`` (a graph break per forward).
    """
    import torch

    def hook(module, inputs, output):
        if type(output) in (tuple, list) and applied():
            return _tuple_output(output)
        result = upstream_hook(module, inputs, output)
        if not applied() or result is not None or not isinstance(output, torch.Tensor):
            return result
        if not (output.is_leaf and output.requires_grad and torch.is_grad_enabled()):
            return result
        patch.repaired("the input embeddings' output is handed on as a copy the model may change in place")
        return output.clone()

    hook.__wrapped__ = upstream_hook
    return hook


def _tuple_output(output: Any) -> Any:
    """What upstream's hook means for embeddings that return ``(embeddings, sizes...)``: every floating-point
    tensor in the tuple requires grad, handed on as a copy where that made it a leaf (None: nothing to change)."""
    import torch

    items, copied = list(output), False
    for index, item in enumerate(items):
        if not isinstance(item, torch.Tensor) or not (item.is_floating_point() or item.is_complex()):
            continue
        if not item.requires_grad:
            item.requires_grad_(True)
        if item.is_leaf and torch.is_grad_enabled():
            items[index], copied = item.clone(), True
    if copied:
        patch.repaired("the input embeddings return a tuple; its tensors are made to require grad "
                       "(upstream's hook calls requires_grad_ on the tuple)")
    return type(output)(items) if copied else None


def _handles(model: Any) -> Iterator[Any]:
    seen = set()
    for attribute in HANDLE_ATTRIBUTES:
        value = model.__dict__.get(attribute)
        for handle in value if isinstance(value, (list, tuple)) else [value]:
            if handle is not None and id(handle) not in seen:
                seen.add(id(handle))
                yield handle


def _is_upstream_hook(hook: Any) -> bool:
    return not hasattr(hook, "__wrapped__") and any("requires_grad_" in code.co_names for code in code_objects(hook))


class TransformersInputGradsLeaf(Patch):
    name = "transformers-input-grads-leaf"
    targets = ("transformers.modeling_utils",)
    # The hook is older than the releases hotfix supports (4.35.0 is the floor of
    # the other transformers fixes; 4.34.1 crashes the same way, measured 2026-11-25).
    # No upper bound: 5.23.0 still has the hook, and from 5.0 checkpointing itself
    # calls it (census: docs/versions.md).
    mechanisms = (
        Mechanism("in-place-on-leaf", {"transformers": ">=4.35.0"}, unreached={"transformers": "<4.35.0"},
                  summary="the hooked embeddings' output is a leaf the model changes in place (GIT, BLIP, BLT, CSM)"),
        Mechanism("tuple-embeddings", {"transformers": ">=4.35.0"}, unreached={"transformers": "<4.35.0"},
                  summary="embeddings that return a tuple make the hook raise (Swin family, Hiera, Data2Vec-vision)"),
    )
    symptom = (
        "RuntimeError: a leaf Variable that requires grad is being used in an in-place operation - "
        "LoRA with gradient checkpointing on GIT, BLIP, BLT, CSM (enable_input_require_grads); "
        "AttributeError: 'tuple' object has no attribute 'requires_grad_' - Swin, Hiera, Data2Vec-vision, ..."
    )
    upstream = ("huggingface/transformers PreTrainedModel.enable_input_require_grads (hook output.requires_grad_; "
                "called by gradient_checkpointing_enable from 5.0.0)")
    fixed_in = None  # 5.23.0 still has it

    def drift(self, module: Any) -> Optional[str]:
        method = getattr(getattr(module, "PreTrainedModel", None), METHOD, None)
        if method is None:
            return f"PreTrainedModel.{METHOD} is missing"
        codes = list(code_objects(method))
        if not any("requires_grad_" in code.co_names for code in codes[1:]):
            return f"PreTrainedModel.{METHOD} no longer registers an output.requires_grad_ hook"
        if not any(name in codes[0].co_names for name in HANDLE_ATTRIBUTES):
            return f"PreTrainedModel.{METHOD} no longer stores its hook handles as {' / '.join(HANDLE_ATTRIBUTES)}"
        return None

    def _apply(self, module: Any) -> None:
        patch = self

        def wrap_registered_hooks(wrapped, instance, args, kwargs):
            result = wrapped(*args, **kwargs)
            if instance is not None and patch.applied:
                for handle in _handles(instance):
                    table = handle.hooks_dict_ref()  # the module's _forward_hooks (a weak reference)
                    hook = None if table is None else table.get(handle.id)
                    if hook is not None and _is_upstream_hook(hook):
                        table[handle.id] = _non_leaf_hook(hook, lambda: patch.applied)
            return result

        self.wrap(module.PreTrainedModel, METHOD, wrap_registered_hooks)


patch = TransformersInputGradsLeaf()
