"""Code objects: what the drift checks read, and the frames dynamo must leave to eager Python.

:func:`code_objects` walks a function's code and the code nested in it (a drift check asks what names
upstream's code reads); :func:`keep_dynamo_out_of_hotfix` marks every code object of hotfix's loaded
modules for dynamo to skip (``hotfix.checkpointing.slot`` calls it when it makes a slot).
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Any, Iterator

logger = logging.getLogger("hotfix")


def code_objects(function: Any) -> Iterator[types.CodeType]:
    """The code of ``function`` and every code object nested in it (for drift checks)."""
    function = getattr(function, "__func__", function)
    code = getattr(function, "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        code = stack.pop()
        yield code
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def hotfix_code() -> Iterator[types.CodeType]:
    """The code of every function and method the loaded hotfix modules define (nested code included)."""
    for name, module in list(sys.modules.items()):
        if name != "hotfix" and not name.startswith("hotfix."):
            continue
        for value in list(vars(module).values()):
            if getattr(value, "__module__", None) != name:
                continue
            members = list(vars(value).values()) if isinstance(value, type) else [value]
            for member in members:
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                parts = [member.fget, member.fset, member.fdel] if isinstance(member, property) else [member]
                for part in parts:
                    if isinstance(part, types.FunctionType):
                        yield from code_objects(part)


def keep_dynamo_out_of_hotfix() -> None:
    """Tell dynamo never to compile a frame of hotfix's code on its own.

    Eager code that runs while a compiled model does (a frame dynamo skipped, the rest of one after a graph
    break) reads the checkpoint function through the slot and calls hotfix's wrapper, and dynamo compiles
    every Python frame it meets there: the slot's ``__get__`` compiled answered "compiling" and handed the
    eager caller the raw function, without hotfix's repair, and the wrapper's helpers were compiled and
    recompiled call after call (torch 2.5: 25 more graph breaks, 8 recompiles).  Upstream's checkpoint code
    there is torch's own, which dynamo skips the same way.  Where dynamo traces a read itself it inlines
    this code as before (``skip_code`` acts on frames dynamo is handed, not on what it inlines); the frames
    hotfix's code calls (a layer's forward) are compiled as upstream.  ``skip_code`` is private; torch 2.4 -
    2.15 have it."""
    try:
        from torch._dynamo.eval_frame import skip_code

        for code in hotfix_code():
            skip_code(code)
    except Exception as exc:  # a torch without it: dynamo may compile hotfix's frames (a slower first step)
        logger.info("hotfix: torch._dynamo.eval_frame.skip_code unavailable (%s): dynamo may compile "
                    "hotfix's own frames", exc)
