"""Ships the start-up files at the root of site-packages, in wheels and editable installs.

setuptools has no declarative way to put a file beside the packages, so build_py writes them into
the build tree (the wheel): ``_hotfix_boot.py`` (a copy of hotfix/startup/boot.py, the start-up
hook), ``hotfix-checkpoint.pth`` (one line that loads it by its location and boots) and
``hotfix-checkpoint.start`` (Python >= 3.15), and ``hotfix_state.py`` (a copy of
hotfix/startup/state.py: the in-process check that activates nothing).  An editable install (``pip install -e .``) gets a
.pth of its own that runs hotfix/startup/boot.py from the checkout with the checkout as hotfix's
home, so a checkout starts up exactly as an install does.  The file names and the .pth line are
hotfix/startup/files.py's, the names in the line the start-up hook's (hotfix/startup/boot.py), read from them
here: defined once.
"""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
BOOT_SOURCE = os.path.join(ROOT, "hotfix", "startup", "boot.py")
FILES_SOURCE = os.path.join(ROOT, "hotfix", "startup", "files.py")
#: the read-only in-process check (``import hotfix_state``): at the root, since importing anything under hotfix/
#: activates hotfix
STATE_SOURCE = os.path.join(ROOT, "hotfix", "startup", "state.py")
STATE_MODULE = "hotfix_state.py"


def _load(path, name):
    """A module of hotfix/startup/ that imports nothing, loaded by its path (setup.py imports no hotfix)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BOOT = _load(BOOT_SOURCE, "_hotfix_boot_for_setup")
FILES = _load(FILES_SOURCE, "_hotfix_files_for_setup")
#: the .pth line of a wheel: the boot module beside it in site-packages, hotfix in the same folder
WHEEL_LINE = FILES.wheel_line(
    "%s is damaged: %s.py is missing from %%s; hotfix is off. Repair: %s" % (BOOT.DISTRIBUTION, FILES.BOOT_MODULE,
                                                                            BOOT.REINSTALL))


def editable_line(root):
    """The editable install's .pth line: the checkout's boot module, the checkout as hotfix's home.  The
    checkout may be moved or deleted after the install: then one line says so, not a traceback."""
    return FILES.editable_line(
        os.path.join(root, "hotfix", "startup", "boot.py"), root,
        "%s is installed in editable mode from %s, but %%s is missing (the checkout moved or was deleted); hotfix "
        "is off. Repair: pip install -e <the checkout>, or pip uninstall %s" % (BOOT.DISTRIBUTION,
                                                                              root.replace("%", "%%"),
                                                                              BOOT.DISTRIBUTION))


class build_py_with_startup_files(build_py):
    def _startup_files(self):
        return {FILES.BOOT_MODULE + ".py": BOOT_SOURCE, STATE_MODULE: STATE_SOURCE, FILES.PTH_FILE: WHEEL_LINE,
                FILES.START_FILE: FILES.START_ENTRY + "\n"}

    def run(self):
        super().run()
        if self.editable_mode:
            return  # the editable wheel carries its own .pth (below)
        for name, text in self._startup_files().items():
            target = os.path.join(self.build_lib, name)
            if text in (BOOT_SOURCE, STATE_SOURCE):
                self.copy_file(text, target)
            else:
                with open(target, "w") as handle:
                    handle.write(text)

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if self.editable_mode:
            return outputs
        return outputs + [os.path.join(self.build_lib, name) for name in self._startup_files()]


class _StrategyWithStartupFile:
    """setuptools' editable strategy, plus the start-up .pth written into the editable wheel."""

    def __init__(self, strategy):
        self._strategy = strategy

    def __enter__(self):
        self._strategy.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self._strategy.__exit__(*exc_info)

    def __call__(self, wheel, files, mapping):
        self._strategy(wheel, files, mapping)
        wheel.writestr(FILES.PTH_FILE, editable_line(ROOT).encode())
        # hotfix_state runs the checkout's file, as the editable hotfix does
        wheel.writestr(STATE_MODULE, ("__file__ = %r\nexec(compile(open(__file__).read(), __file__, 'exec'))\n"
                                      % STATE_SOURCE).encode())


class editable_wheel_with_startup_file(editable_wheel):
    def _select_strategy(self, *args, **kwargs):
        return _StrategyWithStartupFile(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": build_py_with_startup_files, "editable_wheel": editable_wheel_with_startup_file})
