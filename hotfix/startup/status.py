"""Is hotfix's start-up hook in effect here?  What ``hotfix status`` says about scripts that never import hotfix.

The hook is ``hotfix-checkpoint.pth`` (``.start`` on Python >= 3.15) at the root of a site
directory: Python runs those files only from site directories, never from a ``PYTHONPATH``
folder.  So ``pip install --target DIR`` + ``PYTHONPATH=DIR`` puts every file in place, and
``import hotfix`` (``hotfix status`` itself) activates it, while a training script that never
imports hotfix runs unpatched.  The answer is read from this interpreter, which started the
way a script of this environment starts: the boot module's finder is in ``sys.meta_path``
or it is not; where it is not, the files on disk say why.
"""

from __future__ import annotations

import os
import sys
import types
from typing import List, Optional

from hotfix.startup.files import BOOT_MODULE, STARTUP_FILES
from hotfix.startup.hook import TRIGGERS

REMEDY = ("remedy: install it into this environment (pip install hotfix-checkpoint), or put `import hotfix` "
          "at the top of the script, or `import hotfix.auto` in a sitecustomize.py")
UNPATCHED = "a script that never imports hotfix runs UNPATCHED"


def triggers_text() -> str:
    """The trigger names as a sentence's end: "transformers, unsloth or unsloth_zoo"."""
    names = sorted(TRIGGERS)
    return ", ".join(names[:-1]) + " or " + names[-1]


def site_directories() -> List[str]:
    """The directories whose ``.pth`` files this interpreter runs at start-up (none under ``python -S``)."""
    import site

    if sys.flags.no_site:
        return []
    found = list(getattr(site, "getsitepackages", lambda: [])())  # an old virtualenv's site.py lacks it
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    return found


def _same(a: str, b: str) -> bool:
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _startup_file(directories: List[str]) -> Optional[str]:
    for directory in directories:
        for name in STARTUP_FILES:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                return path
    return None


def _hook_finder():
    """The boot module's finder in sys.meta_path (the hook ran here and is waiting or done), or None.

    The boot module the start-up files loaded is ``sys.modules[BOOT_MODULE]``; its finder is its watch, or the
    activating finder that took the watch's place.
    """
    boot = sys.modules.get(BOOT_MODULE)
    classes = tuple(found for found in (getattr(boot, "FirstImportWatch", None), getattr(boot, "ActivateOnFirstImport", None))
                    if isinstance(found, type))
    return next((finder for finder in sys.meta_path if classes and isinstance(finder, classes)), None)


def _customize_importing_hotfix() -> Optional[str]:
    """The sitecustomize/usercustomize that imported hotfix at start-up (the remedy below), or None."""
    for name in ("sitecustomize", "usercustomize"):
        module = sys.modules.get(name)
        held = vars(module).values() if module is not None else ()
        if any(isinstance(value, types.ModuleType) and value.__name__.split(".")[0] == "hotfix" for value in held):
            return getattr(module, "__file__", None) or name
    return None


def startup_hook(package_dir: str, disabled: bool) -> str:
    """One phrase: is the start-up hook in effect in this interpreter, and what that means.

    ``package_dir``: the ``hotfix/`` folder this command runs from; ``disabled``: HOTFIX_DISABLE is set.
    """
    home = os.path.dirname(os.path.abspath(package_dir))
    sites = site_directories()
    installed = _startup_file(sites)
    finder = _hook_finder()
    if disabled:
        return "off (HOTFIX_DISABLE is set): nothing activates hotfix"
    if finder is not None:
        where = installed or getattr(sys.modules.get(BOOT_MODULE), "__file__", None) or "a start-up file"
        text = (f"in effect ({where}): a script that never imports hotfix is patched when it imports "
                f"{triggers_text()}, builds torch's DistributedDataParallel or runs torch's checkpoint")
        loads = getattr(finder, "home", None)
        if loads and not _same(loads, home):
            text += f"; the hook loads hotfix from {loads}, this command runs {package_dir}"
        return text
    customize = _customize_importing_hotfix()
    if customize:
        return (f"not installed as one, but {customize} imports hotfix at start-up: a script is patched when it "
                f"imports {triggers_text()}")
    if sys.flags.no_site:
        return (f"NOT in effect in this interpreter (started without site, python -S): {UNPATCHED} "
                "under the same flag")
    if installed:
        return f"installed ({installed}) but it did not run in this interpreter: {UNPATCHED}; {REMEDY}"
    if _startup_file([home]):  # not in a site directory, or `installed` had found it
        return (f"NOT in effect: hotfix is in {home}, a folder on sys.path (PYTHONPATH, pip install --target) that "
                f"is not a site directory; Python runs .pth start-up files only from site directories, so {UNPATCHED}; "
                f"{REMEDY}")
    if not os.path.isdir(os.path.join(package_dir, "patches")) and os.path.isfile(os.path.join(home, "patches",
                                                                                            "__init__.py")):
        # the fixes beside hotfix/, not in it (as hotfix/__init__.py tells a checkout from an install)
        return (f"NOT in effect: hotfix runs from the source checkout {home}, not installed in this environment: "
                f"{UNPATCHED}; remedy: pip install -e {home}, or put `import hotfix` at the top of the script")
    return (f"NOT in effect: no start-up file beside {package_dir} nor in a site directory ({', '.join(sites)}): "
            f"{UNPATCHED}; {REMEDY}")
