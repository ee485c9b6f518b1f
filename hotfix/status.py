"""What hotfix is doing in this process, as data: the one policy of ``hotfix status``, ``doctor`` and ``check-model``.

:func:`fix_statuses` says, per fix, what it is doing here ("APPLIED to ...", "opted out", "not needed here",
"waiting for ...", "NOT COVERED here: ..."); the CLI renders it.  :func:`not_covered` lists the fixes that do not
repair here what the installed versions may have (``Patch.uncovered_here``): ``hotfix doctor`` prints them
before its cases, ``check-model`` under its verdict (for the model it checked: ``Lost.model_types``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional


@dataclass(frozen=True)
class FixStatus:
    """One fix in this process."""

    name: str
    source: str  # the distribution that declared it
    state: str  # what it is doing here, one phrase (``hotfix status`` prints it after the name)


@dataclass(frozen=True)
class NotCovered:
    """A fix that does not repair here what the installed versions may have."""

    name: str
    why: str
    applies: bool  # False: it does not reach the installed release at all


def state(patch: Any, opted_out: bool, active: bool, problems: Dict[str, str]) -> str:
    """One phrase: what this fix is doing in this process, and what it does NOT COVER here."""
    if opted_out:
        return "opted out"
    invalid = patch.declaration_error()
    if invalid:
        return f"NOT APPLIED: {invalid}"
    uncovered = patch.uncovered_here()  # older than the fix reaches, or state upstream drops before it
    if not patch.applied and not patch.check().applies:
        return f"NOT COVERED here: {uncovered}" if uncovered else "not needed here"
    doing = _doing(patch, active, problems)
    return f"{doing}; NOT COVERED here: {uncovered}" if uncovered else doing


def _doing(patch: Any, active: bool, problems: Dict[str, str]) -> str:
    """Where a fix belongs here: applied, or why not yet."""
    if patch.applied:  # a fix of several targets may be applied to one and have skipped another: both are said
        said = "APPLIED to " + ", ".join(patch.applied_targets)
        return f"{said}; {patch.last_error}" if patch.last_error else said
    if patch.last_error:
        return patch.last_error
    failed = [problems[t] for t in patch.targets if t in problems]
    if failed:
        return "target failed to import: " + "; ".join(failed)
    if not active:
        return "not applied (hotfix inactive)"
    return "waiting for " + ", ".join(patch.targets) + " to be imported"


def fix_statuses(registry: Any, problems: Optional[Dict[str, str]] = None) -> List[FixStatus]:
    """Every loaded fix, by name."""
    return [FixStatus(patch.name, registry.sources.get(key) or "unknown distribution",
                      state(patch, registry.is_opted_out(patch), registry.active, problems or {}))
            for key, patch in sorted(registry.patches().items())]


def not_covered(registry: Any, distribution: Optional[str] = None, model_type: Optional[str] = None
                ) -> List[NotCovered]:
    """The fixes (of ``distribution``'s releases, where given) that do not repair here what the installed versions
    may have; ``model_type`` (transformers' ``config.model_type``): only what upstream drops for that model."""
    found = []
    for patch in registry.patches().values():
        if distribution is not None and distribution not in patch.distributions:
            continue
        why = patch.uncovered_here(model_type)
        if why:
            found.append(NotCovered(patch.name, why, patch.check().applies))
    return found
