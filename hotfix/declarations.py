"""What a fix declares: its mechanisms and the releases that have them, as data read without importing torch.

:class:`Mechanism` and :class:`Lost` are the declared data; :func:`declaration_problems` says why a
fix's declarations cannot be read.  The registry asks once, when it loads the fix, and a fix whose
declarations cannot be read is never applied: a range that does not parse would otherwise read as
"outside the range", and ``hotfix status`` would say "not needed here".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Tuple

from packaging.specifiers import InvalidSpecifier, SpecifierSet


@dataclass(frozen=True)
class Verdict:
    """Whether a patch belongs on this machine, and the sentence saying why."""

    applies: bool
    reason: str


@dataclass(frozen=True)
class Mechanism:
    """One way a fix's bug shows, and the releases that have it: declared data, read without importing torch.

    ``affected`` maps each distribution to a PEP 440 specifier set (every entry
    must match); ``fixed_in`` is the first release without it (None: none yet).
    ``unreached`` (same form) names releases that have, or may have, the
    mechanism but that the fix does not act on (older than the code it hooks, or
    than the releases hotfix supports): ``hotfix status`` says "NOT COVERED"
    there, never "not needed".  ``lost`` (:class:`Lost`, each with its reason) names
    releases where upstream drops the mechanism's state before any checkpoint
    function sees it, so that the fix, applied, cannot restore it: NOT COVERED there
    too.  The census (tools/hotfix_lab/census/) measures every release line against these.
    """

    name: str
    affected: Mapping[str, str] = field(default_factory=dict)
    fixed_in: Optional[str] = None
    summary: str = ""
    unreached: Mapping[str, str] = field(default_factory=dict)
    lost: Tuple["Lost", ...] = ()


@dataclass(frozen=True)
class Lost:
    """Releases where upstream drops a mechanism's state before any checkpoint function sees it (the fix, applied,
    cannot restore it): ``hotfix status`` and ``hotfix doctor`` say "NOT COVERED" there, with ``reason``."""

    affected: Mapping[str, str]  # distribution -> PEP 440 specifier set, every entry (as Mechanism.affected)
    reason: str  # what is dropped, where, and the upstream issue
    # the models whose state is dropped (transformers' config.model_type), () for any: where two declarations hold
    # one release, the census names the one of the model it measured (hotfix status, not knowing the model, says both)
    model_types: Tuple[str, ...] = ()  # a list reads the same


def is_specifier_set(spec: Any) -> bool:
    """A string that parses as a specifier set (a list some packaging releases accept is not the declared form)."""
    if not isinstance(spec, str):
        return False
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        return False
    return True


def _range_problems(ranges: Any, where: str) -> List[str]:
    """Why ``ranges`` (distribution -> PEP 440 specifier set) cannot be read, one phrase per entry; [] when it can."""
    if not isinstance(ranges, Mapping):
        return [f"{where} is a {type(ranges).__name__}, not a mapping of distribution to specifier set"]
    problems = []
    for dist, spec in ranges.items():
        if not isinstance(dist, str) or not dist:
            problems.append(f"{where} names the distribution {dist!r}, not a distribution name")
            continue
        if not is_specifier_set(spec):
            problems.append(f"{where} range of {dist} {spec!r} is not a PEP 440 specifier set")
    return problems


def _lost_problems(mechanism: Mechanism) -> List[str]:
    """Why ``mechanism.lost`` cannot be read, one phrase each; [] when it can."""
    where = f"mechanism {mechanism.name!r}: lost"
    if not isinstance(mechanism.lost, (tuple, list)):
        return [f"{where} is a {type(mechanism.lost).__name__}, not a tuple of hotfix.Lost"]
    problems = []
    for index, lost in enumerate(mechanism.lost):
        if not isinstance(lost, Lost):
            problems.append(f"{where}[{index}] is a {type(lost).__name__}, not a hotfix.Lost")
            continue
        problems += _range_problems(lost.affected, f"{where}[{index}]")
        if not lost.affected or not isinstance(lost.reason, str) or not lost.reason:
            problems.append(f"{where}[{index}] needs a range and a reason")
        if not isinstance(lost.model_types, (tuple, list)) or not all(isinstance(t, str) and t for t in lost.model_types):
            problems.append(f"{where}[{index}] model_types is {lost.model_types!r}, not a tuple of model type names")
    return problems


def _mechanism_problems(mechanisms: Any) -> List[str]:
    if isinstance(mechanisms, Mechanism):  # the trailing comma of (Mechanism(...),) forgotten
        return [f"mechanisms is the Mechanism {mechanisms.name!r} alone, not a tuple of them"]
    if not isinstance(mechanisms, (tuple, list)):
        return [f"mechanisms is a {type(mechanisms).__name__}, not a tuple of hotfix.Mechanism"]
    problems: List[str] = []
    for index, mechanism in enumerate(mechanisms):
        if not isinstance(mechanism, Mechanism):
            problems.append(f"mechanisms[{index}] is a {type(mechanism).__name__}, not a hotfix.Mechanism")
            continue
        problems += _range_problems(mechanism.affected, f"mechanism {mechanism.name!r}: affected")
        problems += _range_problems(mechanism.unreached, f"mechanism {mechanism.name!r}: unreached")
        problems += _lost_problems(mechanism)
    return problems


def declaration_problems(fix: Any) -> Optional[str]:
    """Why ``fix``'s declarations (``targets``, ``affected``, ``mechanisms``) cannot be read, or None."""
    problems: List[str] = []
    if not isinstance(fix.targets, (tuple, list)) or not all(isinstance(t, str) and t for t in fix.targets):
        problems.append(f"targets {fix.targets!r} is not a tuple of module names")
    if fix.affected or not isinstance(fix.affected, Mapping):
        problems += _range_problems(fix.affected, "affected")
    problems += _mechanism_problems(fix.mechanisms)
    return "invalid declaration: " + "; ".join(problems) if problems else None
