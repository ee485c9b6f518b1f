"""``check-model TARGET``: load the user's factory and unpack what it returns."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional, Tuple

from hotfix.diagnostics.step import CheckerError


def load_factory(target: str) -> Callable[[], Any]:
    """``pkg.module:callable`` or ``path/to/file.py:callable`` -> the callable."""
    import importlib
    import importlib.util

    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise CheckerError(f"expected MODULE:CALLABLE or FILE.py:CALLABLE, got {target!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
        if spec is None or spec.loader is None:
            raise CheckerError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise CheckerError(f"{target} is not callable")
    return obj


def unpack_factory_result(result: Any) -> Tuple[Any, Any, Optional[Callable]]:
    """(model, batch) | (model, batch, loss_fn) | {"model":..., "batch":..., "loss_fn":...}.

    Anything else, a model that is not a ``torch.nn.Module`` or a loss_fn that cannot be called is a
    :class:`CheckerError` naming what came back ("could not check"), never a traceback from deep in the
    check or a verdict on something that is not a model.
    """
    if isinstance(result, dict):
        try:
            model, batch, loss_fn = result["model"], result["batch"], result.get("loss_fn")
        except KeyError as exc:
            raise CheckerError(f"the factory's dict lacks {exc}") from None
    elif isinstance(result, (tuple, list)) and len(result) in (2, 3):
        model, batch, loss_fn = result[0], result[1], (result[2] if len(result) == 3 else None)
    else:
        got = f"a {type(result).__name__} of length {len(result)}" if isinstance(result, (tuple, list)) else \
            f"an object of type {type(result).__name__}"
        raise CheckerError(f"the factory returned {got}; it must return (model, batch), (model, batch, loss_fn) "
                           "or a dict with those keys")
    import torch

    if not isinstance(model, torch.nn.Module):
        swapped = " (model and batch swapped?)" if isinstance(batch, torch.nn.Module) else ""
        raise CheckerError(f"the factory's model is of type {type(model).__name__}, not a torch.nn.Module{swapped}")
    if loss_fn is not None and not callable(loss_fn):
        raise CheckerError(f"the factory's loss_fn is of type {type(loss_fn).__name__}, not a callable")
    return model, batch, loss_fn
