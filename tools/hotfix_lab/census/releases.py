"""Which releases the census measures, from PyPI's upload dates (cached in pypi-releases.json; no network in CI).

* transformers: the last patch release of every minor line from 4.35 to the newest in the cache (``last_line``:
  5.24 since 2026-11-28), plus the first
  release of each line where a declared range starts or ends inside that span (the bounds and
  ``fixed_in`` of the built-in fixes' ``mechanisms``, read from the installed hotfix) and 5.0.0
  (where 5.x changed ``enable_input_require_grads`` and the default ``use_reentrant``);
* transformers patch releases at boundaries (``patch_lines``, tools/hotfix_lab/census/boundaries.py): every final
  release of each line of that span that has several, for the bisect between its first and last;
* unsloth-zoo: every release from 2024.11.6 (the first with ``UnslothCheckpointFunction``) to the
  latest, each paired with "the transformers line it was made for": the newest transformers minor
  line whose first release was uploaded before that unsloth-zoo release (what ``pip install -U``
  gave its users), measured at that line's last patch release.
* torch: the last patch release of every minor line from 2.4 to 2.15 (``torch_lines``); under each,
  the census measures transformers ``TORCH_LINE_RELEASE`` (the newest), or, where it does not import
  with that torch, "the transformers release of that torch's time" (``release_of_its_time``: the
  same pairing rule as unsloth-zoo's).

    python -P -m hotfix_lab.census.releases --refresh     # re-read the upload dates from PyPI
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
FIRST_LINE = (4, 35)
FIRST_ZOO = "2024.11.6"
#: the torch releases every census release is measured under (the tests' torch first; hotfix_lab.census.add_release)
CENSUS_TORCHES = ("2.13.0", "2.14.1")
FIRST_TORCH, LAST_TORCH = (2, 4), (2, 15)
#: the transformers release measured under every torch line: the newest when they were measured (2026-11-27;
#: tools/hotfix_lab/census/add_release.py measures a new release under the census's torches, not every line again)
TORCH_LINE_RELEASE = "5.23.0"
#: first releases measured besides the declared boundaries (see the module docstring)
EXTRA_FIRSTS = ("5.0.0",)


def refresh() -> None:
    dates = {}
    for package in ("transformers", "unsloth_zoo", "torch", "deepspeed"):
        with urllib.request.urlopen(f"https://pypi.org/pypi/{package}/json", timeout=60) as answer:
            data = json.load(answer)
        dates[package] = {v: min(f["upload_time_iso_8601"] for f in files)
                          for v, files in data["releases"].items() if files}
    CACHE.write_text(json.dumps(dates, indent=0, sort_keys=True) + "\n")


def _dates() -> Dict[str, Dict[str, str]]:
    return json.loads(CACHE.read_text())


def uploads(package: str) -> Dict[str, str]:
    """``package``'s releases (as PyPI names them) -> first upload date, from the cache."""
    return _dates()[package]


def _final(version: str) -> bool:
    parsed = Version(version)
    return not (parsed.is_prerelease or parsed.is_devrelease)


def last_line() -> Tuple[int, int]:
    """The newest transformers minor line with a final release in the cache: a refresh that brings a new line
    brings it into the census (and the tests then ask for its rows: hotfix_lab.census.add_release measures them)."""
    return max(Version(v).release[:2] for v in _dates()["transformers"] if _final(v))


def builtin_fixes() -> List[object]:
    """The fixes hotfix-checkpoint itself ships (third-party fixes declare their own ranges)."""
    import hotfix

    return [patch for key, patch in hotfix.known_patches().items()
            if hotfix.registry.sources.get(key) == hotfix.DISTRIBUTION]


def declared_bounds(distribution: str) -> List[str]:
    """Every version where a built-in fix's declared range for ``distribution`` starts or ends, sorted."""
    from packaging.specifiers import SpecifierSet

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
    newest = last_line()
    bounds = [v for v in declared_bounds("transformers") if FIRST_LINE <= Version(v).release[:2] <= newest]
    return [v for v in (*bounds, *EXTRA_FIRSTS) if v in versions]


def transformers_releases() -> List[str]:
    """The census's transformers releases, oldest first."""
    versions = [v for v in _dates()["transformers"] if _final(v)]
    last: Dict[Tuple[int, int], str] = {}
    newest = last_line()
    for version in versions:
        line = Version(version).release[:2]
        if FIRST_LINE <= line <= newest and (line not in last or Version(version) > Version(last[line])):
            last[line] = version
    return sorted(set(last.values()) | set(boundary_firsts()), key=Version)


def line_of(version: str) -> List[str]:
    """Every final transformers release of ``version``'s minor line, oldest first."""
    line = Version(version).release[:2]
    return sorted((v for v in _dates()["transformers"] if _final(v) and Version(v).release[:2] == line), key=Version)


def patch_lines() -> List[List[str]]:
    """Every final release of each transformers minor line of the span that has several, oldest first."""
    firsts = {Version(v).release[:2]: v for v in _dates()["transformers"] if _final(v)}
    newest = last_line()
    found = [line_of(v) for line, v in sorted(firsts.items()) if FIRST_LINE <= line <= newest]
    return [patch_releases for patch_releases in found if len(patch_releases) > 1]


def torch_lines() -> List[str]:
    """The last patch release of every torch minor line from ``FIRST_TORCH`` to ``LAST_TORCH``, oldest first."""
    last: Dict[Tuple[int, int], Version] = {}
    for version in _dates()["torch"]:
        parsed = Version(version)
        line = parsed.release[:2]
        if _final(version) and not parsed.local and FIRST_TORCH <= line <= LAST_TORCH:
            last[line] = max(last.get(line, parsed), parsed)
    return [str(last[line]) for line in sorted(last)]


def _line_of_its_time(uploaded: str) -> str:
    """The last measured patch of the newest transformers minor line whose first release precedes ``uploaded``."""
    starts: Dict[Tuple[int, int], str] = {}
    for version, when in _dates()["transformers"].items():
        if _final(version):
            line = Version(version).release[:2]
            starts[line] = min(starts.get(line, when), when)
    firsts = set(boundary_firsts())
    measured = {Version(v).release[:2]: v for v in transformers_releases() if v not in firsts}
    lines = [line for line in sorted(measured) if starts[line] <= uploaded]
    return measured[lines[-1] if lines else min(measured)]


def release_of_its_time(torch_version: str) -> str:
    """The transformers release users had beside ``torch_version`` (paired as unsloth-zoo releases are)."""
    return _line_of_its_time(_dates()["torch"][torch_version])


def zoo_releases() -> List[Tuple[str, str]]:
    """``(unsloth-zoo release, transformers release)``, oldest first."""
    dates = _dates()
    pairs = []
    for zoo, uploaded in sorted(dates["unsloth_zoo"].items(), key=lambda item: Version(item[0])):
        if not _final(zoo) or Version(zoo) < Version(FIRST_ZOO):
            continue
        pairs.append((zoo, _line_of_its_time(uploaded)))
    return pairs


if __name__ == "__main__":
    if "--refresh" in sys.argv:
        refresh()
    print("transformers:", " ".join(transformers_releases()))
    print("unsloth-zoo:", len(zoo_releases()), "releases;", zoo_releases()[0], "...", zoo_releases()[-1])
    print("torch:", " ".join(f"{t} ({release_of_its_time(t)})" for t in torch_lines()))
