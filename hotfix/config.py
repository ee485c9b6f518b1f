"""What the environment asks of hotfix: global opt-out, per-patch opt-out, log level.

Every variable is read when hotfix activates, never cached across activations,
so a test or a notebook can change it and call ``hotfix.activate()`` again.
A value that is not understood never raises: it gets one warning on the
``hotfix`` logger and the documented fallback.

    HOTFIX_DISABLE           1/true/yes/on  -> hotfix does nothing
                             0/false/no/off or empty or unset -> hotfix is active
                             anything else  -> warning, treated as set (disabled)
    HOTFIX_DISABLED_PATCHES  comma-separated patch names to skip; unknown names
                             get a warning that lists the known ones (the
                             registry also accepts a fix's former names)
    HOTFIX_LOG_LEVEL         DEBUG / INFO / WARNING / ERROR for the ``hotfix``
                             logger, shown on stderr even where nothing set up
                             logging (the registry attaches hotfix.notice's
                             handler at activation); WARNING and ERROR also
                             silence the "repaired" lines
                             (default: leave the logger as configured)

Parsing only: of hotfix, this module imports the start-up hook's constants alone.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import FrozenSet, Mapping, Optional

logger = logging.getLogger("hotfix")

from hotfix.startup.hook import DISABLE_VAR, TRUE_VALUES  # the start-up hook reads HOTFIX_DISABLE too

DISABLED_PATCHES_VAR = "HOTFIX_DISABLED_PATCHES"
LOG_LEVEL_VAR = "HOTFIX_LOG_LEVEL"

FALSE_VALUES = frozenset({"", "0", "false", "no", "off"})
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def normalize_patch_name(name: str) -> str:
    """Patch names compare case-insensitively, with '_' and '-' equal."""
    return name.strip().lower().replace("_", "-")


@dataclass(frozen=True)
class Settings:
    disabled: bool = False
    disabled_patches: FrozenSet[str] = field(default_factory=frozenset)
    log_level: Optional[str] = None


def parse_disable(raw: Optional[str]) -> bool:
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    logger.warning(
        "hotfix: %s=%r is not understood (use 1/true/yes/on to disable, "
        "0/false/no/off to enable); treating it as set: hotfix is disabled",
        DISABLE_VAR,
        raw,
    )
    return True


def parse_patch_list(raw: Optional[str]) -> FrozenSet[str]:
    if not raw:
        return frozenset()
    return frozenset(normalize_patch_name(p) for p in raw.split(",") if p.strip())


def parse_log_level(raw: Optional[str]) -> Optional[str]:
    if raw is None or not raw.strip():
        return None
    value = raw.strip().upper()
    if value in LOG_LEVELS:
        return value
    logger.warning(
        "hotfix: %s=%r is not a log level (use one of %s); ignored",
        LOG_LEVEL_VAR,
        raw,
        ", ".join(LOG_LEVELS),
    )
    return None


def read_settings(environ: Optional[Mapping[str, str]] = None) -> Settings:
    env = os.environ if environ is None else environ
    return Settings(
        disabled=parse_disable(env.get(DISABLE_VAR)),
        disabled_patches=parse_patch_list(env.get(DISABLED_PATCHES_VAR)),
        log_level=parse_log_level(env.get(LOG_LEVEL_VAR)),
    )
