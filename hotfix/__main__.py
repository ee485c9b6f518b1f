"""``python -m hotfix`` -> the ``hotfix`` command line."""

import sys

from hotfix.cli import main

sys.exit(main())
