"""The version gate: does a fix belong here, which of its mechanisms are here, what it does NOT COVER here.

Decided from the installed versions (``hotfix.versions``: the metadata and the imported module's
``__version__``) against a fix's declared ranges (``hotfix.declarations``).  Where no version can be
read, the gate cannot rule a fix out: its verdict says so and the fix's drift check, which reads the
target's actual code, decides.  Each function takes a fix whose declarations can be read.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from packaging.version import Version

from hotfix.declarations import Mechanism, Verdict
from hotfix.versions import reader, version_in_range


def check_range(affected: Mapping[str, str]) -> Verdict:
    """Are the installed versions inside ``affected`` (distribution -> specifier set, every entry)?"""
    parts, unknown = [], []
    for dist, spec in affected.items():
        evidence = reader.evidence(dist)
        if not evidence.found:
            return Verdict(False, f"{dist} is not installed")
        version = evidence.version
        note = f" ({evidence.problem()})" if evidence.problem() else ""
        if version is None:
            unknown.append(f"{dist} version unknown{note}")
            continue
        inside = version_in_range(version, spec)
        if inside is None:
            return Verdict(False, f"the affected range {spec!r} of {dist} is not a valid specifier")
        if not inside:
            return Verdict(False, f"{dist} {version} is outside the affected range {spec}{note}")
        parts.append(f"{dist} {version} is in the affected range {spec}{note}")
    if unknown:
        parts.append("; ".join(unknown) + ": applied where the target's code has the affected shape (drift check)")
    return Verdict(True, "; ".join(parts) or "no version constraint")


def _installed(ranges: Mapping[str, str]) -> str:
    """The installed version of each distribution ``ranges`` names, as one phrase ("transformers 5.5.1")."""
    return ", ".join(f"{dist} {reader.evidence(dist).version}" for dist in ranges)


def verdict(fix: Any) -> Verdict:
    """With ``mechanisms`` declared, the fix belongs where any of them is in range (the verdict names them);
    otherwise ``affected`` decides."""
    if not fix.mechanisms:
        return check_range(fix.affected)
    verdicts = [(mechanism.name, check_range(mechanism.affected)) for mechanism in fix.mechanisms]
    inside = [f"{name}: {found.reason}" for name, found in verdicts if found.applies]
    if inside:
        return Verdict(True, "; ".join(inside))
    return Verdict(False, "; ".join(f"{name}: {found.reason}" for name, found in verdicts))


def mechanisms_here(fix: Any) -> Tuple[Mechanism, ...]:
    """The declared mechanisms whose affected range holds the installed versions."""
    return tuple(m for m in fix.mechanisms if check_range(m.affected).applies)


def uncovered_here(fix: Any, model_type: Optional[str] = None) -> Optional[str]:
    """Why the fix does not repair here what the installed versions may have, or None.

    ``Mechanism.unreached`` holding the installed versions counts only where the fix does not apply
    at all (where it applies, the mechanisms it repairs are the news); ``Mechanism.lost``, applied
    or not: upstream drops that state before the fix sees it (for ``model_type``, where given, only
    the declarations about that model or about any).
    """
    applies = verdict(fix).applies
    groups: Dict[Tuple[str, str], List[str]] = {}  # (where and why, said once; the verdict) -> mechanism names
    for mechanism in fix.mechanisms:
        if not applies and mechanism.unreached and check_range(mechanism.unreached).applies:
            reached = ", ".join(f"{dist} {spec}" for dist, spec in mechanism.affected.items())
            where = f"{_installed(mechanism.unreached)} is outside what this fix reaches ({reached})"
            groups.setdefault((where, "may be broken here, unrepaired"), []).append(mechanism.name)
        for lost in mechanism.lost:
            about = model_type is None or not lost.model_types or model_type in lost.model_types
            if about and check_range(lost.affected).applies:
                where = f"{_installed(lost.affected)}: {lost.reason}"
                groups.setdefault((where, "broken here, and hotfix cannot restore it"), []).append(mechanism.name)
    return "; ".join(f"{where}: {', '.join(names)} {said}" for (where, said), names in groups.items()) or None


def fixed_in(fix: Any) -> Optional[str]:
    """The first release without the fix's bug: where every mechanism names one, the latest of them; else None."""
    releases = [mechanism.fixed_in for mechanism in fix.mechanisms]
    return max(releases, key=Version) if releases and all(releases) else None


def distributions(fix: Any) -> Tuple[str, ...]:
    """Every distribution a range of the fix names."""
    names = dict.fromkeys(fix.affected)
    for mechanism in fix.mechanisms:
        names.update(dict.fromkeys(mechanism.affected))
    return tuple(names)
