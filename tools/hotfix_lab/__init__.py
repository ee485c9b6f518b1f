"""hotfix's laboratory: the tooling that proves and measures hotfix, never shipped in its wheel.

Run as modules with tools/ on the path (the test venv has it through a .pth file, scripts/test.sh writes it;
a child interpreter gets it on PYTHONPATH), e.g. ``python -P -m hotfix_lab.census.census --render-only``.

Layers, highest first (import-linter's contract in pyproject.toml; a layer imports only those below it):

* ``census``, ``gpu``, ``bench``: the version censuses, the GPU kit, the benchmarks (independent of each other)
* ``cases``: the lab's training cases, run as children (grad_case, ddp_cases, zoo_routing, ...)
* ``sweep``: the model sweep (every model type of a transformers release, built tiny and trained)
* ``infra``: what all of them share (tiny models, release loaders, the rank protocol, the matrix installer, paths)
"""

import os as _os
import sys as _sys


def _refuse_the_checkouts_root() -> None:
    """The checkout's root on sys.path (``python -m`` run there puts it first) would make its hotfix/ shadow the
    installed hotfix, whose fixes the lab measures (the source tree has no hotfix.patches): say so and stop, rather
    than measure something else.  ``python -P -m hotfix_lab...`` (or a run from any other folder) does not add it."""
    from hotfix_lab.infra.paths import REPO

    root = str(REPO)
    for entry in _sys.path:
        if _os.path.abspath(entry or _os.curdir) == root and _os.path.isdir(_os.path.join(root, "hotfix")):
            raise SystemExit(f"hotfix_lab: {root} is on sys.path, where its hotfix/ shadows the installed hotfix; "
                             "run with python -P -m hotfix_lab... or from another folder")


_refuse_the_checkouts_root()
