"""Ships the start-up files at the root of site-packages, in wheels and editable installs.

setuptools has no declarative way to put a file beside the packages, so
build_py copies boot/hotfix-checkpoint.pth and .start into the build tree (the
wheel).  An editable install (``pip install -e .``) gets a .pth of its own that
runs boot/_hotfix_boot.py from the checkout with the checkout as hotfix's home,
so a checkout starts up exactly as an install does.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

STARTUP_FILES = ("hotfix-checkpoint.pth", "hotfix-checkpoint.start")
ROOT = os.path.dirname(os.path.abspath(__file__))


class build_py_with_startup_files(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return  # the editable wheel carries its own .pth (below)
        for name in STARTUP_FILES:
            self.copy_file(os.path.join("boot", name), os.path.join(self.build_lib, name))

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if self.editable_mode:
            return outputs
        return outputs + [os.path.join(self.build_lib, name) for name in STARTUP_FILES]


# What an editable install's .pth runs (one line: `exec` of this text).  The checkout
# may be moved or deleted after the install: then one line says so, not a traceback.
# In a venv Python reads site-packages twice (lib64 -> lib), hence the guard.
EDITABLE_START = """\
import os, sys, _frozen_importlib as bootstrap, _frozen_importlib_external as external
root, boot = {root!r}, {boot!r}
if "_hotfix_boot" in sys.modules:
    pass  # run already by this .pth, read a second time
elif os.path.isfile(boot):
    spec = external.spec_from_file_location("_hotfix_boot", boot)
    module = sys.modules["_hotfix_boot"] = bootstrap.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.boot(root)
else:
    sys.modules["_hotfix_boot"] = None  # said once
    sys.stderr.write("hotfix: hotfix-checkpoint is installed in editable mode from %s, but %s is missing (the "
                     "checkout moved or was deleted); hotfix is off. Repair: pip install -e <the checkout>, or "
                     "pip uninstall hotfix-checkpoint\\n" % (root, boot))
"""


def editable_startup_line(root):
    """The editable install's .pth line: EDITABLE_START with the checkout's boot/_hotfix_boot.py and root."""
    boot = os.path.join(root, "boot", "_hotfix_boot.py")
    return "import sys; exec(%r)\n" % EDITABLE_START.format(boot=boot, root=root)


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
        wheel.writestr(STARTUP_FILES[0], editable_startup_line(ROOT).encode())


class editable_wheel_with_startup_file(editable_wheel):
    def _select_strategy(self, *args, **kwargs):
        return _StrategyWithStartupFile(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": build_py_with_startup_files, "editable_wheel": editable_wheel_with_startup_file})
