"""A source checkout imports the same modules as an install.

The fixes live in the top-level ``patches/`` folder and are installed as
``hotfix.patches`` (pyproject's ``package-dir`` mapping, applied when the wheel
is built).  A checkout has no build step, so without this module
``python -m hotfix`` run from the repository root would import a hotfix
without its fixes.  :func:`map_patches_folder` makes the same mapping at import
time, and only in a checkout: an installed hotfix has ``hotfix/patches/``
itself and is left alone.  :func:`entry_points` reads the ``hotfix.patches``
entry points from the checkout's ``pyproject.toml`` when no installed metadata
declares them, so the registry discovers the fixes the same way in both.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Dict, Optional

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PACKAGE_DIR)
PATCHES = "hotfix.patches"


def is_checkout(package_dir: str = PACKAGE_DIR) -> bool:
    """hotfix/ without patches/ inside, beside a patches/ package: the source tree."""
    root = os.path.dirname(package_dir)
    return not os.path.isdir(os.path.join(package_dir, "patches")) and os.path.isfile(
        os.path.join(root, "patches", "__init__.py")
    )


def map_patches_folder(package_dir: str = PACKAGE_DIR) -> Optional[object]:
    """In a checkout, register ``<root>/patches`` as ``hotfix.patches``; else do nothing."""
    if not is_checkout(package_dir) or PATCHES in sys.modules:
        return sys.modules.get(PATCHES)
    folder = os.path.join(os.path.dirname(package_dir), "patches")
    spec = importlib.util.spec_from_file_location(
        PATCHES, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[PATCHES] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PATCHES]
        raise
    parent = sys.modules.get("hotfix")
    if parent is not None:
        setattr(parent, "patches", module)
    return module


def entry_points(group: str, package_dir: str = PACKAGE_DIR) -> Dict[str, str]:
    """``name -> "module:attr"`` of ``group`` from the checkout's pyproject.toml ({} elsewhere)."""
    if not is_checkout(package_dir):
        return {}
    try:
        import tomllib  # Python >= 3.11
    except ImportError:  # pragma: no cover - older Pythons run hotfix installed
        return {}
    path = os.path.join(os.path.dirname(package_dir), "pyproject.toml")
    try:
        with open(path, "rb") as handle:
            project = tomllib.load(handle).get("project", {})
    except (OSError, ValueError):
        return {}
    return dict(project.get("entry-points", {}).get(group, {}))
