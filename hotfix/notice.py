"""What hotfix tells a user who configured nothing: its log lines, and one line per fix when it first repairs.

* ``HOTFIX_LOG_LEVEL`` must work in a script that never sets up logging (HF's
  example scripts call ``logging.basicConfig`` only after their imports, and
  hotfix activates during the first ``import transformers``).  As transformers
  does for its own logger, :func:`attach_stderr_handler` gives the ``hotfix``
  logger a stderr handler of its own when the variable is set and nobody has
  configured a handler yet, and stops propagation so a later ``basicConfig``
  does not print every line twice.
* The first time a fix actually repairs a call (one the same run without hotfix
  would get wrong), :meth:`RepairNotice.say` writes one line to stderr naming
  that fix (what was repaired, the upstream reference), the way unsloth announces
  its offload.  One line per fix, so each line names the fix that did the repair
  (a run two fixes repair gets two); these are the only lines hotfix prints by
  default, and ``HOTFIX_LOG_LEVEL=WARNING`` (or ERROR) silences them.
* Once per fix per *job*, not per process.  Under torchrun (``RANK`` /
  ``LOCAL_RANK`` set) only rank 0 speaks.  Processes that multiprocessing starts
  (``torch.multiprocessing.spawn`` sets no ``RANK``; DataLoader workers) share
  their parent's ``authkey`` (spawn and forkserver hand it on, fork inherits it),
  a random secret each fresh interpreter draws: it names the job, whoever started
  it and whether or not hotfix ran there.  The first process of a job to repair
  with a fix claims that fix's line by creating a file (``O_EXCL``: exactly one
  creator) in the job's folder, ``hotfix-notice-<hash of the key>`` in the
  temporary folder (mode 0700, used only if it is this user's own folder); the
  others stay silent.  The job's first process removes the folder when it exits,
  if hotfix was loaded there.  Where it never was (it imports transformers only
  in the spawned function), or its processes ended without running ``atexit``
  (``os._exit``, a kill), the folder stays until another job's first claim:
  each claim names its process, and a folder untouched for a minute whose
  claimants have all ended is removed then.  Where no claim
  can be made (no writable temporary folder) the process says its line: twice
  is better than never.
"""

from __future__ import annotations

import atexit
import logging
import os
import stat
import sys
import threading
from typing import FrozenSet, Optional

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


#: how each "repaired" line starts (doctor and the tests tell it from hotfix's problem lines by this)
REPAIR_NOTICE = "hotfix: repaired "
#: what a fix repaired, unless it says otherwise (the transformers and unsloth checkpoint fixes)
CHECKPOINTED_CALL = "a checkpointed call"
#: the claims' file names start with this, in tempfile.gettempdir()
CLAIM_PREFIX = "hotfix-notice-"


def _is_main_rank(environ) -> bool:
    rank = environ.get("RANK", environ.get("LOCAL_RANK", "0")).strip()
    return rank in ("", "0")


def job_folder() -> str:
    """Where the claims of this job's lines live (the job: multiprocessing's authkey, see the module docstring)."""
    import hashlib
    import tempfile
    from multiprocessing.process import current_process

    digest = hashlib.sha256(bytes(current_process().authkey)).hexdigest()[:32]
    return os.path.join(tempfile.gettempdir(), CLAIM_PREFIX + digest)


def claim_path(patch_name: str) -> str:
    """The file whose creation claims ``patch_name``'s line for this job."""
    import hashlib

    return os.path.join(job_folder(), hashlib.sha256(patch_name.encode()).hexdigest()[:32])


def _own_folder(path: str) -> bool:
    """Is ``path`` a folder (not a link) of this user's own?"""
    info = os.lstat(path)
    return stat.S_ISDIR(info.st_mode) and not (hasattr(os, "geteuid") and info.st_uid != os.geteuid())


def _claim(patch_name: str) -> bool:
    """Is this process the first of its job to say ``patch_name``'s line?  (True also where no claim can be made.)"""
    try:
        path = claim_path(patch_name)
        folder = os.path.dirname(path)
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        if not _own_folder(folder):
            return True  # a link, or another user's: no claim there
        handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(handle, str(os.getpid()).encode())  # whose claim: a folder whose claimants all ended is stale
        finally:
            os.close(handle)
    except FileExistsError:
        return False  # a process of this job said it
    except Exception:  # no temporary folder, read-only, ...: say it
        return True
    _remove_stale_job_folders(folder)
    return True


#: a job folder untouched this long whose claimants have all ended is another job's leftover
STALE_AFTER_S = 60


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except Exception:  # another user's process (PermissionError), or no way to ask: alive
        return True
    return True


def _stale(folder: str, now: float) -> bool:
    """Was ``folder`` left by a job whose processes all ended (``os._exit``, a kill: no atexit ran)?"""
    if not _own_folder(folder):
        return False  # a link, or another user's: never touched
    if now - os.lstat(folder).st_mtime < STALE_AFTER_S:
        return False
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as handle:
            text = handle.read(32).strip()
        if text.isdigit() and _alive(int(text)):
            return False
    return True  # claims of ended processes, or empty ones (made before claims named their process)


def _remove_stale_job_folders(mine: str) -> None:
    """Other jobs' leftover folders go when a job makes its first claim (once per fix and job: rare)."""
    import time

    parent, now = os.path.dirname(mine), time.time()
    try:
        names = [name for name in os.listdir(parent) if name.startswith(CLAIM_PREFIX)]
    except OSError:
        return
    for name in names:
        folder = os.path.join(parent, name)
        if folder == mine:
            continue
        try:
            if _stale(folder, now):
                for claim in os.listdir(folder):
                    os.unlink(os.path.join(folder, claim))
                os.rmdir(folder)
        except Exception:  # another job removing it too, a file that is not ours: leave it
            pass


def _remove_job_folder(pid: int) -> None:
    """At exit of the job's first process (not of a fork of it, nor a process multiprocessing started): its claims go."""
    process = sys.modules.get("multiprocessing.process")
    if process is None or os.getpid() != pid or process.parent_process() is not None:
        return  # never imported multiprocessing: no claim was made in this job
    try:
        folder = job_folder()
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)
    except Exception:
        pass


class RepairNotice:
    """Says once per fix and job that hotfix repaired a call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: the fixes that spoke in this process; replaced, never changed, so the hot path reads it without the lock
        self.said: FrozenSet[str] = frozenset()
        atexit.register(_remove_job_folder, os.getpid())  # this process may be the first of a job: its claims go

    def say(self, patch_name: str, what: str, upstream: str, call: Optional[str] = None) -> None:
        with self._lock:
            if patch_name in self.said:
                return
            self.said = self.said | {patch_name}
        # (read plainly: an odd value was already reported once, by hotfix.config at activation)
        if os.environ.get(LOG_LEVEL_VAR, "").strip().upper() in SILENCING_LEVELS or not _is_main_rank(os.environ):
            return
        if not _claim(patch_name):
            return
        try:
            sys.stderr.write(
                f"{REPAIR_NOTICE}{call or CHECKPOINTED_CALL} ({what}; {patch_name}, {upstream}). "
                f"Shown once per fix; {LOG_LEVEL_VAR}=WARNING silences it.\n"
            )
        except Exception:  # a closed stderr must never break training
            pass


repair_notice = RepairNotice()
