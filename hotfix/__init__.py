"""hotfix (distribution hotfix-checkpoint): in-place repairs for gradient checkpointing on the library versions that broke it.

Importing hotfix activates it (unless ``HOTFIX_DISABLE`` is set): the card's
"``import hotfix`` before or after unsloth/transformers" contract.  The one
place that activates is :mod:`hotfix.auto`, imported by the last line of this
file; the start-up hook (``boot/_hotfix_boot.py``, installed as a ``.pth``
file) reaches it the same way on the first import of transformers, unsloth or
unsloth_zoo.  Every other module of the package only defines things.
"""

from __future__ import annotations

from typing import List

from hotfix.patch import Mechanism, Patch, Verdict
from hotfix.registry import ENTRY_POINT_GROUP, registry

__all__ = ["Patch", "Mechanism", "Verdict", "activate", "revert", "known_patches", "ENTRY_POINT_GROUP",
           "__version__"]
__version__ = "0.1.0"  # the one place: pyproject.toml reads it (tool.setuptools.dynamic)
#: the start-up hook tells hotfix-checkpoint from a user's own module named hotfix by this line
DISTRIBUTION = "hotfix-checkpoint"


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
