"""hotfix (distribution hotfix-checkpoint): in-place repairs for gradient checkpointing on the library versions that broke it.

``import hotfix`` activates it (unless ``HOTFIX_DISABLE`` is set); so does the
``.pth`` file installed beside it, on the first import of transformers,
unsloth or unsloth_zoo.  See README.md for the fixes and the opt-outs.
"""

from __future__ import annotations

from typing import List

from hotfix import checkout
from hotfix.patch import Patch, Verdict
from hotfix.registry import ENTRY_POINT_GROUP, registry

__all__ = ["Patch", "Verdict", "activate", "revert", "known_patches", "ENTRY_POINT_GROUP", "__version__"]
__version__ = "0.1.0"
#: the start-up hook tells hotfix-checkpoint from a user's own module named hotfix by this
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


try:
    checkout.map_patches_folder()  # a source checkout: patches/ is hotfix.patches, as installed
    activate()
except Exception as exc:  # never let hotfix break the user's import
    import logging

    logging.getLogger("hotfix").warning("hotfix: activation failed, continuing without it: %r", exc)
