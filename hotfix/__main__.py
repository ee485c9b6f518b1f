"""``python -m hotfix`` -> the ``hotfix`` command line."""

import sys

import hotfix

if getattr(hotfix, "__file__", None) is None:
    # hotfix/__init__.py is gone (uninstalling PyPI's unrelated `hotfix` deletes it):
    # Python imported the folder as a namespace package without hotfix's API.
    sys.stderr.write(
        "hotfix: hotfix-checkpoint is damaged: hotfix/__init__.py is missing from %s; "
        "repair: pip install --force-reinstall --no-deps hotfix-checkpoint\n" % ", ".join(hotfix.__path__)
    )
    sys.exit(2)

from hotfix.cli import main  # noqa: E402

sys.exit(main())
