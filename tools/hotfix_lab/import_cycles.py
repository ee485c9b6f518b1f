"""Import circles among the repository's modules: every strongly connected component of the import graph.

The graph has an edge A -> B for every ``import`` / ``from ... import`` statement of A that names B, at
module level or inside a function, class or ``try`` (an import inside a function is a circle waiting for
its first call).  Not edges: imports under ``if TYPE_CHECKING:`` (never run), imports of modules outside
the roots (the stdlib, third-party packages), and dynamic imports (``importlib.import_module(name)``:
only a literal string argument is read).

Two kinds of roots:

* a package (``(folder, False)``, or ``(folder, False, "dotted.name")`` where the folder is mapped to
  another name, as pyproject.toml maps patches/ to ``hotfix.patches``): modules have dotted names,
  relative imports are resolved, ``from P import X`` is an edge to the submodule ``P.X`` where X is
  one, else to ``P`` (its ``__init__``); a package's ``__init__`` importing its submodules is an edge
  too.  An import names one module: ``import a.b.c`` is an edge to ``a.b.c`` (its parent packages run
  first, but every module's own parents do, importing or not: that is no edge);
* a flat namespace (``(folder, True)``: a folder whose modules import each other by bare name, as tests/ and
  tests/support do, those folders being on sys.path): ``import conftest`` / ``from layer_calls import X``
  resolve to a sibling module by bare name, else to the other folders on sys.path (``search``), else to a
  package root (``import hotfix``, ``from hotfix_lab.infra import tiny_models``).  A flat module is named
  ``<folder>:<module>``, e.g. ``tests/support:layer_calls``; a package inside a flat folder is imported by its
  bare name and resolved like a package.

    python -P -m hotfix_lab.import_cycles                  # the default roots; exit 1 when there is a circle
    python -P -m hotfix_lab.import_cycles --edges          # ... with the import lines inside each circle
    python -P -m hotfix_lab.import_cycles --flat tests --flat tests/support --search tests --search tests/support
    python -P -m hotfix_lab.import_cycles --package hotfix --package patches=hotfix.patches

From Python (a test)::

    from hotfix_lab import import_cycles
    import_cycles.find_cycles()                    # [] when there is none; else sorted lists of names
    import_cycles.find_cycles([(REPO / "tests", True)], search=[REPO / "tests" / "support"])
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

from hotfix_lab.infra.paths import REPO

#: folders a flat namespace's modules find others in besides their own (none by default: the roots are packages)
DEFAULT_SEARCH: Tuple[str, ...] = ()

Root = Union[Tuple[Union[str, Path], bool], Tuple[Union[str, Path], bool, str]]


def default_roots(repo: Path = REPO) -> List[Tuple[Path, bool, str]]:
    """The packages: ``hotfix`` (patches/ as ``hotfix.patches``) and the lab, ``hotfix_lab`` (tools/hotfix_lab)."""
    roots: List[Tuple[Path, bool, str]] = [(repo / "hotfix", False, "hotfix"),
                                           (repo / "patches", False, "hotfix.patches")]
    if (repo / "tools" / "hotfix_lab").is_dir():
        roots.append((repo / "tools" / "hotfix_lab", False, "hotfix_lab"))
    return roots


class Edge(NamedTuple):
    source: str
    target: str
    path: Path
    line: int
    nested: bool  # inside a function (or a class body's method): runs on the first call, not at import


class Module(NamedTuple):
    name: str  # the graph's name: dotted, or "<folder>:<dotted>" in a flat folder
    dotted: str  # the name Python imports it by
    path: Path
    is_package: bool  # an __init__.py
    space: str  # "" for a package root; the flat folder's label otherwise


class Graph:
    """The modules of the roots and the import edges between them."""

    def __init__(self, roots: Optional[Sequence[Root]] = None, search: Optional[Iterable[Union[str, Path]]] = None,
                 repo: Union[str, Path] = REPO):
        self.repo = Path(repo).resolve()
        roots = default_roots(self.repo) if roots is None else roots
        search_dirs = [self._abs(s) for s in (DEFAULT_SEARCH if search is None else search)]
        search_dirs = [s for s in search_dirs if s.is_dir()]
        self.packages: Dict[str, Module] = {}  # dotted -> module, over the package roots
        self.flat: Dict[str, Dict[str, Module]] = {}  # folder label -> dotted -> module
        self.order: List[str] = []  # the flat folders, as given
        for root in roots:
            folder, flat = self._abs(root[0]), bool(root[1])
            if flat:
                self._add_flat(folder)
            else:
                self._add_package(folder, root[2] if len(root) > 2 and root[2] else folder.name)
        self.search = [self._label(s) for s in search_dirs]
        for folder in search_dirs:  # a folder scripts import from is part of the graph
            self._add_flat(folder)
        self.modules: Dict[str, Module] = {m.name: m for m in self.packages.values()}
        for space in self.flat.values():
            self.modules.update({m.name: m for m in space.values()})
        self.edges: List[Edge] = []
        for module in sorted(self.modules.values(), key=lambda m: m.name):
            self.edges += self._edges_of(module)

    # -- the modules

    def _abs(self, folder: Union[str, Path]) -> Path:
        folder = Path(folder)
        return (folder if folder.is_absolute() else self.repo / folder).resolve()

    def _label(self, folder: Path) -> str:
        try:
            return folder.relative_to(self.repo).as_posix()
        except ValueError:
            return folder.as_posix()

    def _add_package(self, folder: Path, dotted: str) -> None:
        for path in sorted(folder.rglob("*.py")):
            module = self._module(path.relative_to(folder), dotted, path, "")
            if module is not None and self._importable(folder, path):
                self.packages[module.dotted] = module

    def _add_flat(self, folder: Path) -> None:
        label = self._label(folder)
        if label in self.flat:
            return
        self.order.append(label)
        space: Dict[str, Module] = {}
        for path in sorted(folder.glob("*.py")):
            space[path.stem] = Module(f"{label}:{path.stem}", path.stem, path, False, label)
        for init in sorted(folder.glob("*/__init__.py")):  # packages inside the folder, by bare name
            for path in sorted(init.parent.rglob("*.py")):
                module = self._module(path.relative_to(init.parent), init.parent.name, path, label)
                if module is not None and self._importable(init.parent, path):
                    space[module.dotted] = module
        self.flat[label] = space

    @staticmethod
    def _module(relative: Path, prefix: str, path: Path, space: str) -> Optional[Module]:
        parts = list(relative.with_suffix("").parts)
        if not all(part.isidentifier() for part in parts):
            return None
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        dotted = ".".join([prefix, *parts])
        return Module(f"{space}:{dotted}" if space else dotted, dotted, path, is_package, space)

    @staticmethod
    def _importable(top: Path, path: Path) -> bool:
        """Every folder between the package's top and the file is a package (has an __init__.py)."""
        folder = path.parent
        while folder != top:
            if not (folder / "__init__.py").is_file():
                return False
            folder = folder.parent
        return (top / "__init__.py").is_file()

    # -- resolving a dotted name from one module

    def _find(self, dotted: str, importer: Module) -> Optional[Module]:
        """The module ``dotted`` names for ``importer`` (an absolute import), or None (outside the roots)."""
        if importer.space:
            for label in [importer.space] + [s for s in self.search if s != importer.space]:
                found = self.flat[label].get(dotted)
                if found is not None:
                    return found
                if dotted.split(".")[0] in self.flat[label]:  # the top name is this folder's: Python stops here
                    return None
        return self.packages.get(dotted)

    def _is_top_known(self, dotted: str, importer: Module) -> bool:
        top = dotted.split(".")[0]
        if importer.space and any(top in self.flat[label] for label in [importer.space, *self.search]):
            return True
        return top in self.packages

    def _targets(self, node: ast.AST, importer: Module) -> Iterator[Module]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found = self._find(alias.name, importer)
                if found is not None:
                    yield found
            return
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            package = importer.dotted if importer.is_package else importer.dotted.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            if not package:
                return  # a relative import outside any package: an error when run, no edge
            base = f"{package}.{node.module}" if node.module else package
        else:
            base = node.module or ""
            if not self._is_top_known(base, importer):
                return
        module = self._find(base, importer)
        for alias in node.names:
            sub = self._find(f"{base}.{alias.name}", importer) if alias.name != "*" else None
            if sub is not None:
                yield sub
            elif module is not None:
                yield module

    def _dynamic(self, node: ast.Call) -> Optional[str]:
        """``importlib.import_module("literal")`` / ``import_module("literal")``: the literal."""
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."):
            return node.args[0].value
        return None

    def _edges_of(self, module: Module) -> List[Edge]:
        try:
            tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
        except (SyntaxError, UnicodeDecodeError, OSError) as error:
            print(f"import_cycles: cannot parse {module.path}: {error}", file=sys.stderr)
            return []
        out: Dict[str, Edge] = {}  # one edge per target: the first import line (module level before nested)

        def add(target: Module, line: int, nested: bool) -> None:
            if target.name == module.name:
                return
            known = out.get(target.name)
            if known is None or (known.nested and not nested):
                out[target.name] = Edge(module.name, target.name, module.path, line, nested)

        def visit(node: ast.AST, nested: bool) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                for child in node.orelse:
                    visit(child, nested)
                return
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in self._targets(node, module):
                    add(target, node.lineno, nested)
            elif isinstance(node, ast.Call):
                literal = self._dynamic(node)
                target = self._find(literal, module) if literal else None
                if target is not None:
                    add(target, node.lineno, nested)
            inner = nested or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for child in ast.iter_child_nodes(node):
                visit(child, inner)

        visit(tree, False)
        return sorted(out.values(), key=lambda e: (e.line, e.target))

    # -- the circles

    def components(self) -> List[List[str]]:
        """Every strongly connected component of more than one module, each sorted, sorted."""
        successors: Dict[str, List[str]] = {name: [] for name in self.modules}
        for edge in self.edges:
            successors[edge.source].append(edge.target)
        return sorted(sorted(c) for c in _tarjan(successors) if len(c) > 1)

    def edges_within(self, component: Iterable[str]) -> List[Edge]:
        members = set(component)
        return [e for e in self.edges if e.source in members and e.target in members]


def _is_type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
           (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _tarjan(successors: Dict[str, List[str]]) -> List[List[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack = set()
    stack: List[str] = []
    out: List[List[str]] = []
    for start in sorted(successors):
        if start in index:
            continue
        work = [(start, iter(successors[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(successors[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(component)
    return out


def find_cycles(roots: Optional[Sequence[Root]] = None, search: Optional[Iterable[Union[str, Path]]] = None,
                repo: Union[str, Path] = REPO) -> List[List[str]]:
    """Every import circle (strongly connected component of > 1 module) among ``roots``: sorted lists of names.

    ``roots``: ``(folder, flat)`` or ``(folder, False, "dotted.name")``; folders relative to ``repo``; default
    ``default_roots()``.  ``search``: the folders a flat module's bare names resolve to besides its own
    (default tools/hotfix_lab/sweep, tools/hotfix_lab)."""
    return Graph(roots, search, repo).components()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flat", action="append", default=[], metavar="FOLDER",
                        help="a folder of modules imported by bare name (repeatable)")
    parser.add_argument("--package", action="append", default=[], metavar="FOLDER[=dotted.name]",
                        help="a package folder, optionally under another dotted name (repeatable)")
    parser.add_argument("--search", action="append", default=None, metavar="FOLDER",
                        help="a folder bare names also resolve to (repeatable; default tools/hotfix_lab/sweep, tools/hotfix_lab)")
    parser.add_argument("--repo", default=str(REPO), help="relative folders are under this (default: this checkout)")
    parser.add_argument("--edges", action="store_true", help="print the import lines inside each circle")
    args = parser.parse_args(argv)
    roots: Optional[List[Root]] = None
    if args.flat or args.package:
        roots = [(folder, True) for folder in args.flat]
        for spec in args.package:
            folder, _, dotted = spec.partition("=")
            roots.append((folder, False, dotted))
    graph = Graph(roots, args.search, args.repo)
    circles = graph.components()
    for circle in circles:
        print(f"import circle ({len(circle)} modules): {', '.join(circle)}")
        if args.edges:
            for edge in graph.edges_within(circle):
                where = f"{graph._label(edge.path)}:{edge.line}"
                print(f"    {edge.source} -> {edge.target}  ({where}{', inside a function' if edge.nested else ''})")
    if not circles:
        print(f"no import circle among {len(graph.modules)} modules")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
