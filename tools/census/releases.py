"""Which releases the census measures, from PyPI's upload dates (cached in pypi-releases.json; no network in CI).

* transformers: the last patch release of every minor line from 4.35 to 5.23, plus the first
  release of each line where a declared range starts or ends inside that span (the bounds and
  ``fixed_in`` of the built-in fixes' ``mechanisms``, read from the installed hotfix) and 5.0.0
  (where 5.x changed ``enable_input_require_grads`` and the default ``use_reentrant``);
* unsloth-zoo: every release from 2024.11.6 (the first with ``UnslothCheckpointFunction``) to the
  latest, each paired with "the transformers line it was made for": the newest transformers minor
  line whose first release was uploaded before that unsloth-zoo release (what ``pip install -U``
  gave its users), measured at that line's last patch release.

    python tools/census/releases.py --refresh     # re-read the upload dates from PyPI
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Dict, List, Tuple

from packaging.version import Version

HERE = Path(__file__).resolve().parent
CACHE = HERE / "pypi-releases.json"
FIRST_LINE, LAST_LINE = (4, 35), (5, 23)
FIRST_ZOO = "2024.11.6"
#: first releases measured besides the declared boundaries (see the module docstring)
EXTRA_FIRSTS = ("5.0.0",)


def refresh() -> None:
    dates = {}
    for package in ("transformers", "unsloth_zoo"):
        with urllib.request.urlopen(f"https://pypi.org/pypi/{package}/json", timeout=60) as answer:
            data = json.load(answer)
        dates[package] = {v: min(f["upload_time_iso_8601"] for f in files)
                          for v, files in data["releases"].items() if files}
    CACHE.write_text(json.dumps(dates, indent=0, sort_keys=True) + "\n")


def _dates() -> Dict[str, Dict[str, str]]:
    return json.loads(CACHE.read_text())


def _final(version: str) -> bool:
    parsed = Version(version)
    return not (parsed.is_prerelease or parsed.is_devrelease)


def declared_bounds(distribution: str) -> List[str]:
    """Every version where a built-in fix's declared range for ``distribution`` starts or ends, sorted."""
    from packaging.specifiers import SpecifierSet

    from gates import builtin_fixes

    found = set()
    for patch in builtin_fixes():
        for mechanism in patch.mechanisms:
            if distribution in mechanism.affected:
                found.update(spec.version for spec in SpecifierSet(mechanism.affected[distribution])
                             if spec.operator in (">=", "<"))
                if mechanism.fixed_in:
                    found.add(mechanism.fixed_in)
    return sorted(found, key=Version)


def boundary_firsts() -> List[str]:
    """The first releases of lines where a declared transformers range starts or ends, inside the span."""
    versions = {v for v in _dates()["transformers"] if _final(v)}
    bounds = [v for v in declared_bounds("transformers") if FIRST_LINE <= Version(v).release[:2] <= LAST_LINE]
    return [v for v in (*bounds, *EXTRA_FIRSTS) if v in versions]


def transformers_releases() -> List[str]:
    """The census's transformers releases, oldest first."""
    versions = [v for v in _dates()["transformers"] if _final(v)]
    last: Dict[Tuple[int, int], str] = {}
    for version in versions:
        line = Version(version).release[:2]
        if FIRST_LINE <= line <= LAST_LINE and (line not in last or Version(version) > Version(last[line])):
            last[line] = version
    return sorted(set(last.values()) | set(boundary_firsts()), key=Version)


def zoo_releases() -> List[Tuple[str, str]]:
    """``(unsloth-zoo release, transformers release)``, oldest first."""
    dates = _dates()
    starts: Dict[Tuple[int, int], str] = {}  # minor line -> upload of its first release
    for version, uploaded in dates["transformers"].items():
        if _final(version):
            line = Version(version).release[:2]
            starts[line] = min(starts.get(line, uploaded), uploaded)
    firsts = set(boundary_firsts())
    measured = {Version(v).release[:2]: v for v in transformers_releases() if v not in firsts}
    pairs = []
    for zoo, uploaded in sorted(dates["unsloth_zoo"].items(), key=lambda item: Version(item[0])):
        if not _final(zoo) or Version(zoo) < Version(FIRST_ZOO):
            continue
        lines = [line for line in sorted(measured) if starts[line] <= uploaded]
        pairs.append((zoo, measured[lines[-1] if lines else min(measured)]))
    return pairs


if __name__ == "__main__":
    if "--refresh" in sys.argv:
        refresh()
    print("transformers:", " ".join(transformers_releases()))
    print("unsloth-zoo:", len(zoo_releases()), "releases;", zoo_releases()[0], "...", zoo_releases()[-1])
