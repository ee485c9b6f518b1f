"""Copies of ActivationOffloader with one ordering edge taken out, for the stream sanitizer to catch.

Each mutant is built from the installed offloader's own source (``inspect`` +
``ast``): one ``self.device.wait(...)`` statement removed, or the lease
released before the copy back is queued; only the changed method is
recompiled (in the offloader module's namespace) on a subclass.  So the
mutants follow the product code: a wait added there becomes one more mutant.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Tuple

import hotfix.checkpointing.offload.offloader as offload_module
from hotfix.checkpointing.offload.offloader import ActivationOffloader

EARLY_RELEASE = "reload: lease released before the copy back is queued"
UNCHANGED = "control: every method recompiled, nothing removed"


@dataclass(frozen=True)
class Mutant:
    id: str  # short, for test ids: "offload-wait1", "reload-early-release"
    name: str
    build: Callable[[], type]


def _class_tree() -> ast.ClassDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(ActivationOffloader)))
    return next(node for node in tree.body if isinstance(node, ast.ClassDef))


def _methods(cls_tree: ast.ClassDef) -> Dict[str, ast.FunctionDef]:
    return {node.name: node for node in cls_tree.body if isinstance(node, ast.FunctionDef)}


def _is_device_call(node: ast.AST, method: str) -> bool:
    """``self.device.<method>(...)``"""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
            and ast.unparse(node.func.value) == "self.device")


def _statement_lists(function: ast.FunctionDef) -> Iterator[List[ast.stmt]]:
    for node in ast.walk(function):
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield value


def wait_sites() -> List[Tuple[str, int, str]]:
    """(method, n-th wait in that method, source) for every ``self.device.wait(...)`` statement."""
    sites = []
    for name, function in _methods(_class_tree()).items():
        waits = [stmt for body in _statement_lists(function) for stmt in body
                 if isinstance(stmt, ast.Expr) and _is_device_call(stmt.value, "wait")]
        waits.sort(key=lambda stmt: stmt.lineno)
        sites += [(name, n, ast.unparse(stmt)) for n, stmt in enumerate(waits)]
    return sites


def _subclass(name: str, function: ast.FunctionDef) -> type:
    module = ast.Module(body=[function], type_ignores=[])
    ast.fix_missing_locations(module)
    namespace = dict(vars(offload_module))
    exec(compile(module, f"<mutant {name}>", "exec"), namespace)
    return type(f"Mutant_{function.name}", (ActivationOffloader,), {function.name: namespace[function.name]})


def _without_wait(method: str, index: int) -> type:
    function = copy.deepcopy(_methods(_class_tree())[method])
    waits = sorted(((body, stmt) for body in _statement_lists(function) for stmt in body
                    if isinstance(stmt, ast.Expr) and _is_device_call(stmt.value, "wait")),
                   key=lambda pair: pair[1].lineno)
    body, stmt = waits[index]
    body.remove(stmt)
    if not body:
        body.append(ast.Pass())
    return _subclass(f"{method} without wait {index}", function)


def _release_before_copy_back() -> type:
    function = copy.deepcopy(_methods(_class_tree())["reload"])
    for body in _statement_lists(function):
        release = next((s for s in body if isinstance(s, ast.Expr) and ast.unparse(s) == "ticket.lease.release()"),
                       None)
        if release is None:
            continue
        copy_at = next(i for i, s in enumerate(body) if any(_is_device_call(n, "copy") for n in ast.walk(s)))
        body.remove(release)
        body.insert(copy_at, release)
        return _subclass(EARLY_RELEASE, function)
    raise LookupError("reload() no longer calls ticket.lease.release()")


def _unchanged() -> type:
    namespace = dict(vars(offload_module))
    methods = {}
    for name, function in _methods(_class_tree()).items():
        module = ast.Module(body=[copy.deepcopy(function)], type_ignores=[])
        exec(compile(module, f"<control {name}>", "exec"), namespace)
        methods[name] = namespace[name]
    return type("Control", (ActivationOffloader,), methods)


def mutants() -> List[Mutant]:
    """One mutant per removed wait, the early release, and the unchanged control (must stay clean)."""
    found = [Mutant(f"{method}-wait{n + 1}", f"{method}: `{source}` removed",
                    lambda method=method, n=n: _without_wait(method, n))
             for method, n, source in wait_sites()]
    return found + [Mutant("reload-early-release", EARLY_RELEASE, _release_before_copy_back),
                    Mutant("control", UNCHANGED, _unchanged)]
