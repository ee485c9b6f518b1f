"""Startup hook of hotfix, run by ``hotfix-checkpoint.pth`` (``.start`` on Python >= 3.15).

Why it is so small: site-packages ``.pth`` lines run in *every* interpreter
start (pip, DataLoader workers, torchrun children), so this module imports
only ``sys`` and ``_thread``, reads only the environment, and writes nothing.
It installs one inert-until-needed finder at the front of ``sys.meta_path``;
the first import of a library hotfix repairs imports ``hotfix`` (wrapt,
packaging, entry points...), which attaches the patches through wrapt
post-import hooks, before that library's own modules load.
"""

import sys
import _thread

# Top-level names whose first import activates hotfix.  Plugin patches whose
# targets are imported earlier are still applied: wrapt runs a hook at once
# for a module already loaded.
TRIGGERS = frozenset({"transformers", "unsloth", "unsloth_zoo"})

# Same values as hotfix.config.TRUE_VALUES (kept in sync by a test).  Any
# other non-empty value is left to hotfix.config, which warns about it.
DISABLE_VALUES = frozenset({"1", "true", "yes", "on"})


class ActivateOnFirstImport:
    """A meta path finder that never finds anything; it only activates hotfix.

    It stays in sys.meta_path after activating (as a cheap no-op): removing a
    finder while the import system iterates over sys.meta_path would make it
    skip the next finder for that one import.
    """

    def __init__(self):
        # Re-entrant: activation itself imports modules on this thread.  Other
        # threads importing a trigger wait until activation has finished.
        self._lock = _thread.RLock()
        self._claimed = False
        self.finished = False

    def find_spec(self, fullname, path=None, target=None):
        if self.finished or fullname not in TRIGGERS:
            return None
        with self._lock:
            if not self._claimed:
                self._claimed = True
                try:
                    import hotfix  # noqa: F401  (importing activates)
                except Exception as exc:
                    sys.stderr.write(
                        "hotfix: auto-activation failed, continuing without hotfix: %r\n" % (exc,)
                    )
                finally:
                    self.finished = True
        return None


def disabled(environ=None):
    if environ is None:
        import os  # already imported by site; costs nothing

        environ = os.environ
    return environ.get("HOTFIX_DISABLE", "").strip().lower() in DISABLE_VALUES


def boot():
    """Entry point of the .pth line and of the PEP 829 .start file."""
    try:
        if disabled():
            return
        for finder in sys.meta_path:
            if isinstance(finder, ActivateOnFirstImport):
                return  # booted twice (.pth and .start both honoured): once is enough
        finder = ActivateOnFirstImport()
        sys.meta_path.insert(0, finder)
        if any(name in sys.modules for name in TRIGGERS):
            finder.find_spec(next(name for name in TRIGGERS if name in sys.modules))
    except Exception as exc:  # never break interpreter start-up
        sys.stderr.write("hotfix: boot failed, continuing without hotfix: %r\n" % (exc,))
