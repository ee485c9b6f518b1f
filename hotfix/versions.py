"""Installed versions of the libraries hotfix patches, and range checks on them.

Versions come from the installed distribution's metadata
(``importlib.metadata``); when a module is importable without metadata (a
vendored copy, a source checkout on ``sys.path``) the top-level module's
``__version__`` is used instead.  Ranges are ``packaging`` specifier sets and
always admit pre-releases and local versions: a ``5.0.0rc1`` or a
``2.6.0a0+git1234`` build is as broken as the release it leads to.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# distribution name -> import name, for the libraries `hotfix status` reports.
REPORTED_LIBRARIES = {
    "torch": "torch",
    "transformers": "transformers",
    "unsloth": "unsloth",
    "unsloth-zoo": "unsloth_zoo",
}


def installed_version(distribution: str, module: Optional[str] = None) -> Optional[str]:
    """Version string of ``distribution``, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        pass
    except Exception:  # broken metadata must never break the user's program
        pass
    top = (module or distribution.replace("-", "_")).split(".")[0]
    loaded = sys.modules.get(top)
    version = getattr(loaded, "__version__", None)
    return str(version) if version is not None else None


def version_in_range(version: str, specifier: str) -> Optional[bool]:
    """True/False for ``version`` in ``specifier``; None when either cannot be parsed."""
    try:
        parsed = Version(version)
        spec = SpecifierSet(specifier)
    except (InvalidVersion, InvalidSpecifier):
        return None
    return spec.contains(parsed, prereleases=True)
