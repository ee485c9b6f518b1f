"""The checkpointing modes a check runs, and how a checkpoint function is named in reports.

``reentrant`` / ``non-reentrant``: ``activation_checkpointing_enable`` (5.x; where a model has
only the older name, ``gradient_checkpointing_enable``) with ``use_reentrant`` True / False;
``default``: the enabler with no arguments (the model's own default and whatever checkpoint function is
installed, e.g. unsloth's; its qualified name is reported).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Optional

MODES = ("reentrant", "non-reentrant", "default")


def describe_function(fn: Any) -> str:
    """Qualified name of a checkpoint function, with partial keywords and unsloth-style swaps shown."""
    import functools

    if fn is None:
        return "none"
    inner = getattr(fn, "__wrapped__", None)
    if isinstance(fn, functools.partial):
        kw = ", ".join(f"{k}={v!r}" for k, v in fn.keywords.items())
        return f"{describe_function(fn.func)}({kw})" if kw else describe_function(fn.func)
    if inner is not None and inner is not fn and type(fn).__module__.startswith("wrapt"):
        return f"{describe_function(inner)} (wrapped)"
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', None) or type(fn).__qualname__}"


def installed_checkpoint() -> str:
    """What torch.utils.checkpoint holds now (unsloth and others swap these)."""
    import torch.utils.checkpoint as tuc

    parts = [describe_function(tuc.checkpoint)]
    cf = getattr(tuc, "CheckpointFunction", None)
    if cf is not None and getattr(cf, "__module__", "") != "torch.utils.checkpoint":
        parts.append(f"CheckpointFunction={cf.__module__}.{cf.__qualname__}")
    tm = sys.modules.get("transformers.modeling_utils")
    ckpt = getattr(tm, "checkpoint", None) if tm is not None else None
    if ckpt is not None and ckpt is not tuc.checkpoint:
        parts.append(f"transformers.modeling_utils.checkpoint={describe_function(ckpt)}")
    return "; ".join(parts)


def layer_function(model) -> Optional[str]:
    for m in model.modules():
        fn = m.__dict__.get("_gradient_checkpointing_func")
        if fn is not None and getattr(m, "gradient_checkpointing", False):
            return describe_function(fn)
    return None


#: (enabler, its kwargs argument, disabler, the property that says it is on): transformers' names, newest first.
#: 5.x's ``activation_checkpointing*`` names are the first-class ones (5.24 deprecates the ``gradient_checkpointing*``
#: names for removal in v6); before them, the ``gradient_checkpointing*`` names.
NAMES = (("activation_checkpointing_enable", "activation_checkpointing_kwargs", "activation_checkpointing_disable",
          "is_activation_checkpointing"),
         ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs", "gradient_checkpointing_disable",
          "is_gradient_checkpointing"))


def _names(model: Any) -> tuple:
    """The names ``model`` has (``NAMES``' first whose enabler it has), or the old ones where it has neither."""
    return next((names for names in NAMES if callable(getattr(model, names[0], None))), NAMES[-1])


def _takes_checkpointing_kwargs(enable: Any, keyword: str = "gradient_checkpointing_kwargs") -> bool:
    """Does the enabler take its kwargs argument (``gradient_checkpointing_kwargs``: transformers 4.35+)?"""
    import inspect

    try:
        parameters = inspect.signature(enable).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return True
    return any(p.name == keyword or p.kind is p.VAR_KEYWORD for p in parameters)


def mode_name(mode: Any) -> str:
    """A mode is one of MODES, or ``(name, enable_function)`` for another way to switch it on."""
    return mode if isinstance(mode, str) else mode[0]


def unknown_modes(modes) -> list:
    return [m for m in modes if not (m in MODES or (isinstance(m, tuple) and len(m) == 2 and callable(m[1])))]


def enable(model, mode: Any) -> str:
    """Switch checkpointing on in ``mode``; the checkpoint function a layer now holds, named."""
    if not isinstance(mode, str):  # (name, function): e.g. transformers 5.17's activation_checkpointing_enable
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            mode[1](model)
        held = layer_function(model)
        if held is None:
            raise NotImplementedError(f"{mode[0]} set no checkpoint function on any layer")
        return held
    enabler, keyword, _, _ = _names(model)
    enable = getattr(model, enabler, None)
    if enable is None:
        raise NotImplementedError(f"{type(model).__name__} has no {enabler}()")
    if getattr(model, "supports_gradient_checkpointing", True) is False:
        raise NotImplementedError(f"{type(model).__name__}.supports_gradient_checkpointing is False")
    takes_kwargs = _takes_checkpointing_kwargs(enable, keyword)
    if mode in ("reentrant", "non-reentrant") and not takes_kwargs:
        raise NotImplementedError(f"{type(model).__name__}.{enabler}() takes no {keyword} (transformers before "
                                  "4.35): use_reentrant cannot be chosen")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if mode == "reentrant":
            enable(**{keyword: {"use_reentrant": True}})
        elif mode == "non-reentrant":
            enable(**{keyword: {"use_reentrant": False}})
        elif mode == "default":
            enable()
        else:
            raise ValueError(f"unknown checkpointing mode {mode!r}; known: {', '.join(MODES)}")
    held = layer_function(model)
    if held is None:
        raise NotImplementedError(f"{enabler}() set no checkpoint function on any layer"
                                  + ("; its layers call torch's checkpoint from their own code (transformers "
                                     "before 4.35), which this check cannot see" if mode == "default"
                                     and not takes_kwargs else ""))
    return held if mode != "default" else f"{held}; installed: {installed_checkpoint()}"


def disable(model) -> None:
    _, _, disabler, flag = _names(model)
    disable = getattr(model, disabler, None)
    with warnings.catch_warnings():  # the deprecated names warn (FutureWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if disable is not None and getattr(model, flag, False):
            disable()
