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


def editable_startup_line(root):
    """The wheel's .pth line, with boot/_hotfix_boot.py and hotfix's home taken from the checkout."""
    boot = os.path.join(root, "boot", "_hotfix_boot.py")
    return ("import sys, _frozen_importlib as b, _frozen_importlib_external as e; "
            f"s = e.spec_from_file_location('_hotfix_boot', {boot!r}); "
            "m = sys.modules['_hotfix_boot'] = b.module_from_spec(s); s.loader.exec_module(m); "
            f"m.boot({root!r})\n")


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
