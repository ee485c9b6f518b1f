"""Installed versions of the libraries hotfix patches, from every source there is.

A version string can lie or be missing: a dist-info whose ``METADATA`` was
lost (``importlib.metadata.version()`` then returns None, it does not raise),
a metadata version that does not parse, or metadata left behind by another
install while the code on ``sys.path`` is a different release.  So two sources
are read and compared:

* the distribution's metadata (``importlib.metadata``), and
* the imported top-level module's ``__version__`` (only if it is already
  imported: hotfix never imports a library to learn its version), or where it
  has none yet, the metadata in the folder it was imported from.

The module's own ``__version__`` wins when it parses, since it belongs to the
code that actually runs; otherwise the metadata's.  When the two disagree, or
neither can be read, :meth:`VersionEvidence.problem` says so and the reader
logs it once per distribution; the patch contract then lets the drift check,
which looks at the actual code, decide (``hotfix.patch``).

Ranges are ``packaging`` specifier sets and always admit pre-releases and
local versions: a ``5.0.0rc1`` or a ``2.6.0a0+git1234`` build is as broken as
the release it leads to.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

logger = logging.getLogger("hotfix")

# distribution name -> import name, for the libraries `hotfix status` reports.
REPORTED_LIBRARIES = {
    "torch": "torch",
    "transformers": "transformers",
    "unsloth": "unsloth",
    "unsloth-zoo": "unsloth_zoo",
}


def _parses(version: Optional[str]) -> bool:
    if version is None:
        return False
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def _same(a: str, b: str) -> bool:
    """One release: equal versions, or equal but for a build label only one side carries.

    PyPI's Linux torch wheels record ``2.14.1`` in their metadata while ``torch.__version__``
    says ``2.14.1+cu130``: the same code, not a disagreement worth a note.
    """
    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion:
        return a.strip() == b.strip()
    return va == vb or (va.public == vb.public and (va.local is None or vb.local is None))


@dataclass(frozen=True)
class VersionEvidence:
    """What the metadata and the imported module say about one distribution."""

    distribution: str
    found: bool  # a dist-info exists or the module is imported
    metadata: Optional[str]  # None: no dist-info, or its METADATA is gone
    module: Optional[str]  # None: not imported, or neither __version__ nor metadata beside it
    module_source: str = "__version__"  # where ``module`` was read: "__version__", or the metadata beside it

    @property
    def version(self) -> Optional[str]:
        """The version to decide with, or None when no source gives one that parses."""
        if _parses(self.module):
            return self.module
        if _parses(self.metadata):
            return self.metadata
        return None

    def problem(self) -> Optional[str]:
        """Why the sources are not one clean answer, or None when they are."""
        if not self.found:
            return None
        if self.metadata is not None and self.module is not None and not _same(self.metadata, self.module):
            chosen = "the module's" if self.version == self.module else "the metadata's"
            if self.version is None:
                chosen = "neither"
            return (f"{self.distribution} metadata says {self.metadata!r} but the imported module's "
                    f"{self.module_source} is {self.module!r}; using {chosen}")
        if self.version is None:
            return (f"{self.distribution} version cannot be read (metadata {self.metadata!r}, module __version__ "
                    f"{self.module!r})")
        if self.metadata is None:
            return f"{self.distribution} has no readable metadata version; using its __version__ {self.module!r}"
        if not _parses(self.metadata):
            return f"{self.distribution} metadata version {self.metadata!r} does not parse; using {self.version!r}"
        return None

    def describe(self) -> str:
        """One phrase for ``hotfix status``."""
        if not self.found:
            return "not installed"
        text = self.version or "unknown version"
        problem = self.problem()
        return f"{text}  (! {problem})" if problem else text


def _metadata_beside(module, distribution: str) -> Optional[str]:
    """The version in the metadata installed beside an imported package that has no ``__version__`` (yet: a fix's
    target imported while the package's ``__init__`` still runs, as DeepSpeed's checkpointing module is, before
    ``deepspeed.__version__`` is set): the ``sys.path`` folder holding the package holds its own dist-info, which may
    be another release than the first one on sys.path (a release first on PYTHONPATH, another installed)."""
    import os

    where = getattr(module, "__file__", None)
    if not where:
        return None
    folder = os.path.dirname(os.path.dirname(os.path.abspath(where)))
    wanted = canonicalize_name(distribution)
    try:
        for found in metadata.distributions(path=[folder]):
            if canonicalize_name(found.metadata["Name"] or "") == wanted:
                return found.version
    except Exception:  # broken metadata must never break the user's program
        return None
    return None


class VersionReader:
    """Reads :class:`VersionEvidence`; logs each distribution's problem once per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._warned: set = set()

    def evidence(self, distribution: str, module: Optional[str] = None) -> VersionEvidence:
        found = False
        meta_version = None
        try:
            dist = metadata.distribution(distribution)
            found = True
            meta_version = dist.version  # None when METADATA is missing
        except metadata.PackageNotFoundError:
            pass
        except Exception:  # broken metadata must never break the user's program
            pass
        top = (module or distribution.replace("-", "_")).split(".")[0]
        loaded = sys.modules.get(top)
        module_version = getattr(loaded, "__version__", None) if loaded is not None else None
        source = "__version__"
        if module_version is None and loaded is not None:
            module_version, source = _metadata_beside(loaded, distribution), "metadata beside it"
        if module_version is not None and not isinstance(module_version, str):
            module_version = str(module_version)
        found = found or loaded is not None
        return VersionEvidence(distribution, found, meta_version if isinstance(meta_version, str) else None,
                               module_version, source)

    def warn_once(self, evidence: VersionEvidence) -> None:
        problem = evidence.problem()
        if not problem:
            return
        with self._lock:
            if evidence.distribution in self._warned:
                return
            self._warned.add(evidence.distribution)
        logger.warning("hotfix: %s", problem)


reader = VersionReader()


def installed_version(distribution: str, module: Optional[str] = None) -> Optional[str]:
    """Best version string of ``distribution``, or None when none can be read or it is not installed."""
    return reader.evidence(distribution, module).version


def version_in_range(version: str, specifier: str) -> Optional[bool]:
    """True/False for ``version`` in ``specifier``; None when either cannot be parsed."""
    try:
        parsed = Version(version)
        spec = SpecifierSet(specifier)
    except (InvalidVersion, InvalidSpecifier):
        return None
    return spec.contains(parsed, prereleases=True)
