"""The house keeps its shape: the layer rules hold, and no import circle stands anywhere in the tree.

* import-linter's contracts (``[tool.importlinter]`` in pyproject.toml) over the installed wheel, where the fixes
  are ``hotfix.patches``: the fixes import only hotfix's public API and the engine; the engine imports neither
  the fixes nor the registry; the core imports no fix, engine, diagnostics or CLI; no circle between siblings;
  and over the lab (tools/hotfix_lab): the product never imports it, its layers hold, no circle in it.
  A planted violation breaks them (the contracts are not vacuous).
* hotfix_lab.import_cycles over the source tree (hotfix/, patches/, tools/, tests/): no circle, module or package.
* tools/ and tests/ import no private module of the product; the product imports neither tools/ nor tests/.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Tuple

import hotfix
from conftest import REPO, TESTS, TOOLS
from hotfix_lab import import_cycles

LINT = Path(sys.executable).parent / "lint-imports"
INSTALLED = Path(hotfix.__file__).parent


def _lint(where: Path) -> subprocess.CompletedProcess:
    """lint-imports with pyproject's contracts, over the ``hotfix`` found first from ``where``."""
    return subprocess.run([str(LINT), str(REPO / "pyproject.toml")], cwd=str(where), capture_output=True, text=True,
                          timeout=300)


def test_the_import_contracts_hold_on_the_installed_wheel():
    proc = _lint(TESTS / "_scratch")  # no hotfix/ there: the installed one
    assert proc.returncode == 0 and " broken" in proc.stdout and "0 broken" in proc.stdout, proc.stdout + proc.stderr


def test_a_fix_importing_the_registry_breaks_a_contract(tmp_path):
    copy = tmp_path / "hotfix"
    shutil.copytree(INSTALLED, copy, ignore=shutil.ignore_patterns("__pycache__"))
    fix = copy / "patches" / "transformers_frozen_inputs.py"
    fix.write_text(fix.read_text() + "\nfrom hotfix.registry import registry  # planted\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0 and "hotfix.patches.transformers_frozen_inputs -> hotfix.registry" in proc.stdout, \
        proc.stdout + proc.stderr


def test_the_lab_infrastructure_importing_a_census_breaks_its_layers(tmp_path):
    copy = tmp_path / "hotfix_lab"  # found first from tmp_path: the contracts read this copy
    shutil.copytree(TOOLS / "hotfix_lab", copy, ignore=shutil.ignore_patterns("__pycache__"))
    module = copy / "infra" / "tiny_models.py"
    module.write_text(module.read_text() + "\nfrom hotfix_lab.census import releases  # planted\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0 and "hotfix_lab.infra.tiny_models -> hotfix_lab.census.releases" in proc.stdout, \
        proc.stdout + proc.stderr


def test_no_import_circle_anywhere_in_the_tree():
    roots = import_cycles.default_roots(REPO) + [(folder, True) for folder in sorted(TESTS.iterdir())
                                                  if folder.is_dir() and any(folder.glob("*.py"))] + [(TESTS, True)]
    search = [TESTS, TESTS / "support"]
    assert import_cycles.find_cycles(roots, search=search) == []


def _imports(folder: Path) -> Iterator[Tuple[Path, str]]:
    """(file, imported module name) for every absolute import in the .py files below ``folder``."""
    for path in folder.rglob("*.py"):
        if "_scratch" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                yield from ((path, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                yield path, node.module
                yield from ((path, f"{node.module}.{alias.name}") for alias in node.names)


def _product_modules():
    """Every module of the installed product, by name (the wheel's hotfix/ and its top-level start-up module)."""
    names = {"_hotfix_boot"}
    for path in INSTALLED.rglob("*.py"):
        parts = path.relative_to(INSTALLED.parent).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_tools_and_tests_import_no_private_module_of_the_product():
    product = _product_modules()
    private = {name for name in product if any(p.startswith("_") and not p.startswith("__") for p in name.split("."))}
    found = [(str(path.relative_to(REPO)), module) for folder in (TOOLS, TESTS) for path, module in _imports(folder)
             if module in private]
    assert "_hotfix_boot" in private and found == []


def test_the_product_imports_neither_tools_nor_tests():
    lab = {"hotfix_lab"} | {path.stem for path in TESTS.rglob("*.py")} - {"__init__", "__main__"}
    found = [(str(path.relative_to(REPO)), module) for folder in (REPO / "hotfix", REPO / "patches")
             for path, module in _imports(folder) if module.split(".")[0] in lab]
    assert lab and found == []
