"""The memory and time guard around one training step.

A watchdog thread samples RSS; when a step grows more than ``memory_limit``
above where it started, or runs longer than its time limit, the step is
aborted from the next saved-tensor pack hook or module call (both also run
inside the recomputation of reentrant checkpointing) with :class:`GuardTripped`.
If the step does not return within ``grace`` seconds of that (a runaway inside
one C++ call) and ``hard_exit`` is on, the process says why on stderr and
exits with status 3 before the machine's OOM killer ends it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Optional, Tuple

from hotfix.diagnostics.memory import fmt_bytes, rss_bytes

GUARD_EXIT_STATUS = 3
_SAMPLE_INTERVAL_S = 0.01


class GuardTripped(RuntimeError):
    """Raised inside a step when the memory or time guard fires."""


class Watchdog:
    """Samples RSS; sets ``reason`` when a step exceeds the memory or time limit."""

    def __init__(self, baseline: int, memory_limit: int, hard_exit: bool, grace: float,
                 last_words: Optional[Callable[[str], None]] = None) -> None:
        #: called with the reason just before a hard exit (a case runner prints its JSON line there)
        self.last_words = last_words
        self.baseline = baseline
        self.memory_limit = memory_limit
        self.hard_exit = hard_exit
        self.grace = grace
        self.reason: Optional[str] = None
        self._tripped_at: Optional[float] = None
        self._step: Optional[Tuple[str, float, float]] = None  # (label, started, time_limit)
        self.peak = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="hotfix-check-watchdog", daemon=True)
        self._thread.start()

    def begin(self, label: str, time_limit: float) -> None:
        with self._lock:
            self.reason = None
            self._tripped_at = None
            self.peak = rss_bytes() or 0
            self.baseline = self.peak
            self._step = (label, time.monotonic(), time_limit)

    def end(self) -> None:
        with self._lock:
            self._step = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)

    def _loop(self) -> None:
        while not self._stop.wait(_SAMPLE_INTERVAL_S):
            with self._lock:
                step = self._step
                if step is None:
                    continue
                label, started, time_limit = step
                rss = rss_bytes() or 0
                self.peak = max(self.peak, rss)
                now = time.monotonic()
                if self.reason is None:
                    if rss - self.baseline > self.memory_limit:
                        self.reason = (
                            f"memory guard: RSS grew {fmt_bytes(rss - self.baseline)} during the {label} step, "
                            f"over the limit of {fmt_bytes(self.memory_limit)} (runaway memory)"
                        )
                    elif now - started > time_limit:
                        self.reason = f"time guard: the {label} step ran over {time_limit:.0f} s"
                    if self.reason is not None:
                        self._tripped_at = now
                elif self.hard_exit and self._tripped_at is not None and now - self._tripped_at > self.grace:
                    sys.stderr.write(
                        f"hotfix check-model: {self.reason}; the step did not stop within {self.grace:.0f} s, "
                        f"exiting with status {GUARD_EXIT_STATUS} before the OOM killer does\n"
                    )
                    sys.stderr.flush()
                    if self.last_words is not None:
                        self.last_words(self.reason)
                    os._exit(GUARD_EXIT_STATUS)

    def check(self) -> None:
        reason = self.reason
        if reason is not None:
            raise GuardTripped(reason)
