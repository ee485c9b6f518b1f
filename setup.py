"""Ships the start-up files at the root of site-packages.

setuptools has no declarative way to put a file beside the packages, so
build_py copies boot/hotfix-checkpoint.pth and .start into the build tree;
they end up in wheels and editable installs alike.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

STARTUP_FILES = ("hotfix-checkpoint.pth", "hotfix-checkpoint.start")


class build_py_with_startup_files(build_py):
    def run(self):
        super().run()
        for name in STARTUP_FILES:
            self.copy_file(os.path.join("boot", name), os.path.join(self.build_lib, name))

    def get_outputs(self, include_bytecode=True):
        return list(super().get_outputs(include_bytecode)) + [
            os.path.join(self.build_lib, name) for name in STARTUP_FILES
        ]


setup(cmdclass={"build_py": build_py_with_startup_files})
