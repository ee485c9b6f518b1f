"""``import tiny_models`` for scripts and children: hotfix/diagnostics/tiny_models.py, loaded without importing hotfix."""

import sys

import standalone

# Python's import returns whatever sys.modules holds once this file has run: the real module.
del sys.modules[__name__]
standalone.load("tiny_models")
