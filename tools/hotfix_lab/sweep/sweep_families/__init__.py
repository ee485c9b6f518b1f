"""What the sweep's generic builder cannot guess, per family of model types.

The generic builder (``sweep_shrink.shrink_config`` + ``sweep_inputs.dummy_batch``) shrinks
every size field of a config and makes inputs from ``main_input_name``.  Some families need
more: sizes that must agree with each other (rotary sections that sum to half the head size,
stage widths of hierarchical vision models), inputs with metadata (patch grids, aspect ratios,
audio lengths a frame size divides), or a variant that switches on an optional path.  Each
module of this package covers one family and defines any of

``CONFIGS``  ``{model_type: fix(config)}``       run after ``shrink_config``, edits the config in place
``INPUTS``   ``{model_type: batch(model, config, generator) -> dict}``  replaces ``dummy_batch``
``UNBUILDABLE`` ``{model_type: reason}``          a precise one-line reason the sweep cannot build it here
``FACTORIES`` ``{model_type: make(config_class) -> config}``  where the config class's defaults raise
``VARIANTS`` ``{model_type: {name: fix(config)}}``  optional paths switched on (run after ``CONFIGS``): swept
                 as ``<model_type>+<name>``, extra rows outside the coverage count

The facts (which sizes must agree, what shapes the inputs take) are learnt from transformers'
own model tests (each model's ``ModelTester``); the code is ours.  A model type may appear in
one module only.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from typing import Callable, Dict, Optional

_TABLES = ("CONFIGS", "INPUTS", "UNBUILDABLE", "FACTORIES", "VARIANTS")


@functools.lru_cache(maxsize=None)
def _tables() -> Dict[str, Dict[str, object]]:
    merged: Dict[str, Dict[str, object]] = {name: {} for name in _TABLES}
    owner: Dict[str, str] = {}
    for info in pkgutil.iter_modules(__path__):
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except Exception as exc:  # one broken family must not stop the others (it is named on stderr)
            print(f"sweep_families: {info.name} not loaded: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        for table in _TABLES:
            for model_type, value in getattr(module, table, {}).items():
                if owner.setdefault(f"{table}:{model_type}", info.name) != info.name:
                    raise ValueError(f"{table}[{model_type!r}] defined in {owner[table + ':' + model_type]} and {info.name}")
                merged[table][model_type] = value
    return merged


def config_fix(model_type: str) -> Optional[Callable]:
    return _tables()["CONFIGS"].get(model_type)


def inputs_for(model_type: str) -> Optional[Callable]:
    return _tables()["INPUTS"].get(model_type)


def unbuildable(model_type: str) -> Optional[str]:
    """The reason ``model_type`` (or ``<model_type>+<variant>``) cannot be built here, or None."""
    return _tables()["UNBUILDABLE"].get(model_type.partition("+")[0])


def factory(model_type: str) -> Optional[Callable]:
    return _tables()["FACTORIES"].get(model_type)


def variants() -> Dict[str, Dict[str, Callable]]:
    """``{model_type: {variant name: fix(config)}}`` of every family."""
    return dict(_tables()["VARIANTS"])


def split_variant(name: str):
    """``"deberta-v2+layer_norm"`` -> ("deberta-v2", fix); a plain model type -> (name, None)."""
    base, _, variant = name.partition("+")
    return base, (_tables()["VARIANTS"].get(base, {}).get(variant) if variant else None)
