"""What hotfix tells a user who configured nothing: its log lines, and one line when it first repairs.

* ``HOTFIX_LOG_LEVEL`` must work in a script that never sets up logging (HF's
  example scripts call ``logging.basicConfig`` only after their imports, and
  hotfix activates during the first ``import transformers``).  As transformers
  does for its own logger, :func:`attach_stderr_handler` gives the ``hotfix``
  logger a stderr handler of its own when the variable is set and nobody has
  configured a handler yet, and stops propagation so a later ``basicConfig``
  does not print every line twice.
* The first time in a process that a fix actually changes a checkpointed call,
  :meth:`RepairNotice.say` writes one line to stderr (what was repaired, the
  upstream reference), the way unsloth announces its offload.  It is the only
  line hotfix prints by default; ``HOTFIX_LOG_LEVEL=WARNING`` (or ERROR)
  silences it.  Under torchrun only rank 0 prints it; DataLoader workers never
  checkpoint, so they never do.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from hotfix.config import LOG_LEVEL_VAR

logger = logging.getLogger("hotfix")

SILENCING_LEVELS = ("WARNING", "ERROR")


def attach_stderr_handler(level: str) -> None:
    """Make ``level`` visible without any logging setup (once; a no-op where handlers exist)."""
    logger.setLevel(level)
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))  # every hotfix message starts with "hotfix:"
    logger.addHandler(handler)
    logger.propagate = False


#: how the once-per-process line starts (doctor and the tests tell it from hotfix's problem lines by this)
REPAIR_NOTICE = "hotfix: repaired a checkpointed call"


def _is_main_rank(environ) -> bool:
    rank = environ.get("RANK", environ.get("LOCAL_RANK", "0")).strip()
    return rank in ("", "0")


class RepairNotice:
    """Says once per process that hotfix changed a checkpointed call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.said = False  # read without the lock on the hot path: a plain bool

    def say(self, patch_name: str, what: str, upstream: str) -> None:
        with self._lock:
            if self.said:
                return
            self.said = True
        # (read plainly: an odd value was already reported once, by hotfix.config at activation)
        if os.environ.get(LOG_LEVEL_VAR, "").strip().upper() in SILENCING_LEVELS or not _is_main_rank(os.environ):
            return
        try:
            sys.stderr.write(
                f"{REPAIR_NOTICE} ({what}; {patch_name}, {upstream}). "
                f"Shown once per process; {LOG_LEVEL_VAR}=WARNING silences it.\n"
            )
        except Exception:  # a closed stderr must never break training
            pass


repair_notice = RepairNotice()
