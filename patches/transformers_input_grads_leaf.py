"""transformers: ``enable_input_require_grads()``'s hook makes a leaf the model changes in place, or raises on a tuple.

What breaks: the hook calls ``output.requires_grad_(True)`` on the input embeddings' output.
With frozen embeddings (LoRA) that output becomes a leaf needing grad, and GIT, BLIP's text
model, BLT and CSM change it in place right after: "a leaf Variable that requires grad is
being used in an in-place operation".  From 5.0 ``gradient_checkpointing_enable()`` calls the
method itself, so merely turning checkpointing on crashes.  Embeddings that return a tuple
(Swin family, Data2Vec-vision, Hiera, TimeSformer) make the hook raise AttributeError.

How this fixes it: each hook it registers is replaced in its module's hook table by a plain
function around it (the handle still removes it).  Where upstream's hook left a leaf needing grad,
the output is handed on as a copy until it is known whether the model changes it in place (the
copy's version counter, read when backward reaches it or at a later call: ``CopyRule``).  Changed:
upstream would have crashed, "repaired" is said, every forward gets a copy.  Never changed: no copy
again.  A tuple's floating tensors are made to require grad under the same rule.  docs/fixes/transformers-input-grads-leaf.md.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from hotfix import Patch
from hotfix.checkpointing.code import code_objects
from hotfix.checkpointing.slot_fix import on_every_reached_release

METHOD = "enable_input_require_grads"
#: where upstream keeps the handles: one (4.x, and 5.x "for BC") or all (5.x)
HANDLE_ATTRIBUTES = ("_require_grads_hooks", "_require_grads_hook")


#: copies handed on while a hook's verdict is still open, at most (forwards with no backward, e.g. an eval loop in
#: grad mode): then a model that changed none of them in place is taken not to
WATCH_LIMIT = 8
#: what the "repaired" line says was repaired
CALL = "a forward of the input embeddings"


class CopyRule:
    """For one hook: does its model change in place the leaf upstream's hook makes?  Learned by watching copies.

    Until it is known (``changes_in_place`` None) each leaf is handed on as a copy, and the copy is
    watched: a detached alias shares its version counter, which every in-place change bumps.  A copy
    changed by the next call, or by the time backward reaches it (its forward is over), settles it:
    True (upstream would have raised): "repaired" is said and every later leaf is a copy; False: no
    copy ever again, upstream's leaf goes on exactly as without hotfix.
    """

    def __init__(self, fix: Patch) -> None:
        self.fix = fix
        self.changes_in_place: Optional[bool] = None
        self._watched: list = []  # detached aliases of the watched copies (their version counters)

    def hand_on(self, leaf: Any) -> Any:
        """What the module outputs instead of ``leaf`` (a leaf needing grad, in grad mode)."""
        verdict = self.changes_in_place
        if verdict is False:
            return leaf
        copy = leaf.clone()
        if verdict is None:
            self._watch(copy)
        return copy

    def _watch(self, copy: Any) -> None:
        if self._changed():  # an earlier copy was changed in place, its forward long over
            self._decide(True)
            return
        self._watched.append(copy.detach())
        if len(self._watched) >= WATCH_LIMIT:
            self._decide(False)
            return
        register = getattr(copy.grad_fn, "register_prehook", None)  # torch >= 2.0; else the next call decides
        if register is not None:
            register(self._at_backward)

    def _at_backward(self, grad_outputs: Any) -> None:
        if self.changes_in_place is None:
            self._decide(self._changed())

    def _changed(self) -> bool:
        return any(alias._version > 0 for alias in self._watched)  # a fresh copy's counter is 0

    def _decide(self, changes_in_place: bool) -> None:
        self.changes_in_place, self._watched = changes_in_place, []
        if changes_in_place:
            self.fix.repaired("the model changed in place the leaf enable_input_require_grads()'s hook made of it "
                              "(upstream: 'a leaf Variable that requires grad is being used in an in-place "
                              "operation'); it gets a copy", call=CALL)


def _non_leaf_hook(upstream_hook: Any, fix: Patch) -> Callable:
    """Upstream's ``make_inputs_require_grads(module, input, output)`` hook, handing on a copy where the model
    changes the leaf it made in place (a :class:`CopyRule` per hook).

    A plain function, not a wrapt proxy: torch.compile traces forward hooks, and dynamo cannot trace a
    ``FunctionWrapper`` (a graph break per forward).  While compiling, every leaf is handed on as a copy,
    unwatched (a version counter is no graph input), and nothing is said.
    """
    import torch

    rule = CopyRule(fix)

    def hook(module, inputs, output):
        if type(output) in (tuple, list) and fix.applied:
            return _tuple_output(output, rule)
        result = upstream_hook(module, inputs, output)
        if not fix.applied or result is not None or not isinstance(output, torch.Tensor):
            return result
        if not (output.is_leaf and output.requires_grad and torch.is_grad_enabled()):
            return result
        if torch.compiler.is_compiling():
            return output.clone()
        handed_on = rule.hand_on(output)
        return None if handed_on is output else handed_on

    hook.__wrapped__ = upstream_hook
    return hook


def _tuple_output(output: Any, rule: CopyRule) -> Any:
    """What upstream's hook means for embeddings that return ``(embeddings, sizes...)``: every floating-point
    tensor in the tuple requires grad, handed on as a copy where the model changes it in place (the hook's
    :class:`CopyRule`).  Upstream's hook raises on every such call, so this is always a repair.  None: the
    tuple itself goes on (its tensors now require grad)."""
    import torch

    items, copied = list(output), False
    for index, item in enumerate(items):
        if not isinstance(item, torch.Tensor) or not (item.is_floating_point() or item.is_complex()):
            continue
        if not item.requires_grad:
            item.requires_grad_(True)
        if item.is_leaf and torch.is_grad_enabled():
            handed_on = item.clone() if torch.compiler.is_compiling() else rule.hand_on(item)
            if handed_on is not item:
                items[index], copied = handed_on, True
    rule.fix.repaired("the input embeddings return a tuple; its tensors are made to require grad "
                      "(upstream's hook calls requires_grad_ on the tuple: AttributeError)", call=CALL)
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
        on_every_reached_release("in-place-on-leaf",
            "the hooked embeddings' output is a leaf the model changes in place (GIT, BLIP, BLT, CSM)"),
        on_every_reached_release("tuple-embeddings",
            "embeddings that return a tuple make the hook raise (Swin family, Hiera, Data2Vec-vision)"),
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
                        table[handle.id] = _non_leaf_hook(hook, patch)
            return result

        self.wrap(module.PreTrainedModel, METHOD, wrap_registered_hooks)


patch = TransformersInputGradsLeaf()
