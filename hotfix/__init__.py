"""hotfix (distribution hotfix-checkpoint): in-place repairs for gradient checkpointing on the library versions that broke it.

Importing hotfix activates it (unless ``HOTFIX_DISABLE`` is set): the card's
"``import hotfix`` before or after unsloth/transformers" contract.  The one
place that activates is :mod:`hotfix.auto`, imported by the last line of this
file; the start-up hook (``hotfix/startup/boot.py``, run by a ``.pth``
file) reaches it the same way on the first import of transformers, unsloth or
unsloth_zoo.  Every other module of the package only defines things.
"""

from __future__ import annotations

from typing import List

#: the distribution's name; the start-up hook tells hotfix-checkpoint's hotfix/ from a user's own module named
#: hotfix by this line (within the file's first 4 KiB: boot.MARKER)
from hotfix.startup.hook import DISTRIBUTION  # noqa: E402,F401  (hotfix.DISTRIBUTION)


def _fixes_beside_a_checkout() -> None:
    """In a source checkout, ``hotfix.patches`` is the ``patches/`` folder beside ``hotfix/``.

    The wheel installs the top-level ``patches/`` as ``hotfix/patches/`` (pyproject's
    package-dir); a checkout keeps the two side by side, so a script or ``python -m
    hotfix`` run from its root would find no fix.  There the folder is made the
    subpackage through the import system's own spec (nothing copied), as the wheel
    would; an install, which has ``hotfix/patches/``, is left alone.
    """
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    beside = os.path.join(os.path.dirname(here), "patches")
    if os.path.isdir(os.path.join(here, "patches")) or not os.path.isfile(os.path.join(beside, "__init__.py")):
        return
    import importlib.util  # only in a checkout

    spec = importlib.util.spec_from_file_location(f"{__name__}.patches", os.path.join(beside, "__init__.py"),
                                                  submodule_search_locations=[beside])
    package = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package)
    setattr(sys.modules[__name__], "patches", package)  # bound on the parent, as any subpackage import does


_fixes_beside_a_checkout()

from hotfix.declarations import Lost, Mechanism, Verdict  # noqa: E402
from hotfix.patch import Patch  # noqa: E402
from hotfix.registry import ENTRY_POINT_GROUP, registry  # noqa: E402

__all__ = ["Patch", "Mechanism", "Lost", "Verdict", "activate", "revert", "known_patches", "ENTRY_POINT_GROUP",
           "__version__"]
__version__ = "0.1.0"  # the one place: pyproject.toml reads it (tool.setuptools.dynamic)


def activate() -> bool:
    """Attach every patch (idempotent).  False when disabled by the environment."""
    return registry.activate()


def revert() -> List[str]:
    """Undo every applied patch, restoring the original objects; returns their names."""
    return registry.revert()


# Not called `patches`: that name is the hotfix.patches subpackage, which
# Python binds on the package as soon as a built-in patch is imported.
def known_patches():
    """Known patches by name."""
    return dict(registry.patches())


from hotfix import auto  # noqa: E402,F401  (activation: the one call site, see hotfix/auto.py)
