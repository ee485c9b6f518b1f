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
    """(model, batch) | (model, batch, loss_fn) | {"model":..., "batch":..., "loss_fn":...}."""
    if isinstance(result, dict):
        try:
            return result["model"], result["batch"], result.get("loss_fn")
        except KeyError as exc:
            raise CheckerError(f"the factory's dict lacks {exc}") from None
    if isinstance(result, (tuple, list)) and len(result) in (2, 3):
        return result[0], result[1], (result[2] if len(result) == 3 else None)
    raise CheckerError("the factory must return (model, batch), (model, batch, loss_fn) or a dict with those keys")
