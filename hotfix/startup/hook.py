"""The start-up hook's module (``boot.py``, with its second half) as this process loaded it: once, under ``_hotfix_boot``.

The ``.pth`` line loads the hook at interpreter start-up; the package takes the hook's names (the triggers, the
distribution's name, HOTFIX_DISABLE's values, the loader proxy) from that same module object instead of
importing ``hotfix.startup.boot``, which would run the file a second time.  Where the hook did not run in this
process (``python -S``, a checkout that is not installed, another installation's hook) or is not this
installation's own, the file beside this one is loaded by its path, once, and not put in ``sys.modules``
(``hotfix status`` tells from ``sys.modules["_hotfix_boot"]`` whether the start-up hook ran).
"""

import importlib.util
import os
import sys

from hotfix.startup.files import BOOT_MODULE

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(_HERE, "boot.py")
#: the folder holding this package (site-packages; an editable install's source root), as Python found it
HOME = os.path.dirname(os.path.dirname(_HERE))


def _is_this_installations(module) -> bool:
    """The wheel's copy sits at the root of the site directory holding this package; an editable install's
    .pth runs this very file."""
    where = getattr(module, "__file__", None)
    if not where:
        return False
    where = os.path.realpath(where)
    return where == os.path.realpath(SOURCE) or where == os.path.realpath(os.path.join(HOME, BOOT_MODULE + ".py"))


def _load():
    loaded = sys.modules.get(BOOT_MODULE)
    if loaded is not None and _is_this_installations(loaded):
        return loaded
    spec = importlib.util.spec_from_file_location(BOOT_MODULE, SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _complete(boot, home):
    """The hook's second half (hotfix/startup/activation.py) runs in it at the first import outside the standard
    library, which importing this package is: done already where the hook ran, here where it did not.  Where that
    file is gone or broken, ``import hotfix`` fails as a damaged install, saying so and how to repair (the start-up
    hook says it in one line and lets the program run on without hotfix)."""
    try:
        boot.complete(home)
    except Exception as exc:
        raise ImportError(boot.damaged(home, exc, "import hotfix cannot complete")) from None


BOOT = _load()
_complete(BOOT, HOME)
# The names the package uses, the hook's own objects (``hotfix.config.TRUE_VALUES is BOOT.TRUE_VALUES``).
PACKAGE, DISTRIBUTION, TRIGGERS = BOOT.PACKAGE, BOOT.DISTRIBUTION, BOOT.TRIGGERS
ENTRY_POINT_GROUP, DISABLE_VAR, TRUE_VALUES = BOOT.ENTRY_POINT_GROUP, BOOT.DISABLE_VAR, BOOT.TRUE_VALUES
LoaderProxy, spec_behind, wrappable, is_third_party = BOOT.LoaderProxy, BOOT.spec_behind, BOOT.wrappable, BOOT.is_third_party
CHECKPOINT_MODULE, CHECKPOINT_GENERATOR = BOOT.CHECKPOINT_MODULE, BOOT.CHECKPOINT_GENERATOR
CHECKPOINT_FUNCTION = BOOT.CHECKPOINT_FUNCTION


def stop_watching_torch() -> None:
    """hotfix activates, however it came to (``import hotfix`` before or after torch, a trigger): the start-up
    finder's work is done (``finish``).  Its watches come off torch's objects (``boot.WATCHED``) and none is put by a
    later ``import torch``, so that the fixes attach to torch's own objects, never to a watch, and a revert leaves
    torch's own in place (a watch standing over the fixes' wrappers put them back at its first call)."""
    for finder in list(sys.meta_path):
        if type(finder).__name__ == BOOT.ActivateOnFirstImport.__name__:
            finish = getattr(finder, "finish", None)
            if finish is not None:
                finish()
