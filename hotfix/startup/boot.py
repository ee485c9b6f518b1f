"""The start-up hook: run by ``hotfix-checkpoint.pth`` (``.start`` on Python >= 3.15) in every interpreter.

Small on purpose: it runs in every process (pip, DataLoader workers, torchrun children), imports only ``sys`` and
``_thread``, reads only the environment and writes nothing.  It is loaded once per process, as ``_hotfix_boot``
(the wheel's copy at the root of site-packages; an editable install's .pth names this file); the package reads
its names from that same module (``hotfix.startup.hook``), never loading it a second time.

It holds hotfix's start-up names and puts one finder first in ``sys.meta_path``, :class:`FirstImportWatch`,
which answers None until the process imports a module outside the standard library.  Then ``complete`` runs
the hook's second half (hotfix/startup/activation.py: the finder that activates hotfix at the first import of
a trigger, hotfix's loading) in this module, and that finder takes the watch's place.  A process that imports
only the standard library never pays for the second half (docs/performance.md, "start-up").  What is not
needed at interpreter start-up lives elsewhere: the start-up files and their .pth line in
``hotfix.startup.files``, the long story in docs/design.md ("Start-up and activation").
"""

import sys
import _thread

# Top-level names whose first import activates hotfix.  Plugin patches whose
# targets are imported earlier are still applied: wrapt runs a hook at once
# for a module already loaded.
TRIGGERS = frozenset({"transformers", "unsloth", "unsloth_zoo"})

# A torch-only script imports no trigger: a plain module, a Hub model's own code, timm, diffusers' UNet calling torch's
# reentrant checkpoint under DDP(find_unused_parameters=True); torchtitan- or torchtune-style training (FSDP2, torch's
# non-reentrant checkpoint with preserve_rng_state=False, compiled submodules); a script checkpointing reentrantly with
# preserve_rng_state=False.  Activating at `import torch` would cost every torch process hotfix's import; so after
# torch's import the start-up hook only puts watches (plain functions, no import) on DDP's __init__, on the generator
# every non-reentrant checkpoint call runs (looked up as a module global at each call) and on the ``apply`` every
# reentrant one ends in (``CheckpointFunction.apply``, inherited: the watch is the class's own until it goes): the
# first DDP built or checkpoint run activates hotfix, and the watches go (they go too where a trigger activates
# first), leaving torch's own objects in place.
WATCHED = "torch"
DDP_MODULE, DDP_CLASS = "torch.nn.parallel.distributed", "DistributedDataParallel"
#: torch's checkpoint module, the generator its non-reentrant calls run and the autograd Function its reentrant calls
#: apply (hotfix.checkpointing.torch_checkpoint's too)
CHECKPOINT_MODULE, CHECKPOINT_GENERATOR = "torch.utils.checkpoint", "_checkpoint_without_reentrant_generator"
CHECKPOINT_FUNCTION = "CheckpointFunction"

# Third-party fixes declare themselves in this entry-point group; their targets
# are only known once their module is imported, which the start-up hook cannot
# do.  So when any distribution other than hotfix-checkpoint declares the group,
# the first top-level import of a module outside the standard library activates
# hotfix, once that module ran (see ActivateOnFirstImport._third_party_fixes_installed):
# a fix's targets are other libraries' modules, and a standard-library module a
# fix targets that is imported before gets its fix at activation all the same
# (a post-import hook runs at once for a module already imported).
ENTRY_POINT_GROUP = "hotfix.patches"
# The interpreter's own start-up lookups: never worth a scan.
STARTUP_NAMES = frozenset({"sitecustomize", "usercustomize"})
# The standard library's top-level names (Python >= 3.10; none known on 3.9: every first import is looked at).
STANDARD_LIBRARY = getattr(sys, "stdlib_module_names", frozenset())
# What activation imports beyond the standard library: hotfix's two dependencies,
# and hotfix itself (an `import hotfix` still running activates at its own end).
OWN_IMPORTS = frozenset({"hotfix", "wrapt", "packaging"})

# HOTFIX_DISABLE's values that turn hotfix off (hotfix.config reads the same set).
# Any other non-empty value is left to hotfix.config, which warns about it.
DISABLE_VAR = "HOTFIX_DISABLE"
TRUE_VALUES = frozenset({"1", "true", "yes", "on"})

PACKAGE = "hotfix"
DISTRIBUTION = "hotfix-checkpoint"
# hotfix/__init__.py carries this line (within its first 4 KiB); another distribution's
# hotfix/__init__.py, or a user's own hotfix.py, does not.
MARKER = b"from hotfix.startup.hook import DISTRIBUTION"
REINSTALL = "pip install --force-reinstall --no-deps hotfix-checkpoint"

#: the hook's second half, under the home (the folder holding ``hotfix/``)
SECOND_HALF = ("hotfix", "startup", "activation.py")
_COMPLETING = _thread.RLock()  # one thread runs the second half, once


def _say(message):
    sys.stderr.write("hotfix: %s\n" % (message,))


def second_half(home):
    import os  # already loaded by site

    return os.path.join(home, *SECOND_HALF)


def damaged(home, exc, then):
    """What to say where the second half could not run; ``then``: what happens next (start-up and the package's
    import say it both)."""
    return "%s is damaged: the start-up hook's second half %s could not run (%r); %s. Repair: %s" % (
        DISTRIBUTION, second_half(home), exc, then, REINSTALL)


def complete(home):
    """Run the hook's second half in this module, once (``ActivateOnFirstImport`` and the rest are then its
    names); returns that finder class.  Raises where the file is missing or damaged."""
    with _COMPLETING:
        if "ActivateOnFirstImport" in globals():
            return globals()["ActivateOnFirstImport"]
        import _frozen_importlib_external as external  # the import system's own, loaded

        path = second_half(home)
        # importlib's file loader: its cached bytecode where valid, as an import would
        code = external.SourceFileLoader(__name__, path).get_code(__name__)
        exec(code, globals())
        return globals()["ActivateOnFirstImport"]


class FirstImportWatch:
    """First in sys.meta_path from start-up: finds nothing, and at the first top-level import of a module outside
    the standard library, completes the hook and hands its place (and that import) to the activating finder.

    After that it is out of ``sys.meta_path``; asked again (someone kept it), it passes the question on.
    """

    def __init__(self, home):
        self.home = home  # the directory holding hotfix/
        self.finder = None  # the activating finder, once made
        self.finished = False  # completing the hook failed: this process runs without hotfix
        self._busy = False  # this watch is completing the hook (an import from inside is not ours to take)

    def find_spec(self, fullname, path=None, target=None):
        finder = self.finder
        if finder is None:
            if path is not None or target is not None or self.finished:
                return None
            if (fullname in STANDARD_LIBRARY or fullname in STARTUP_NAMES) and not any(
                    name in sys.modules for name in TRIGGERS):
                return None  # (a trigger loaded past this watch is the activating finder's to notice, at any import)
            finder = self.take_over()
            if finder is None:
                return None
        return finder.find_spec(fullname, path, target)

    def take_over(self):
        """Complete the hook, put its finder where this watch stands, and return it (None where that failed:
        one line on stderr, and the process goes on without hotfix)."""
        with _COMPLETING:
            if self.finder is not None or self.finished or self._busy:
                return self.finder
            self._busy = True
            try:
                finder = complete(self.home)(self.home)
                # in place: the import system may be iterating over sys.meta_path right now, and a finder taken
                # out or put in front would shift the ones after it
                where = next((at for at, found in enumerate(sys.meta_path) if found is self), None)
                if where is None:
                    sys.meta_path.insert(0, finder)
                else:
                    sys.meta_path[where] = finder
                self.finder = finder
            except Exception as exc:
                self.finished = True
                _say(damaged(self.home, exc, "continuing without hotfix"))
            finally:
                self._busy = False
        return self.finder


def disabled(environ=None):
    if environ is None:
        import os  # already imported by site; costs nothing

        environ = os.environ
    return environ.get(DISABLE_VAR, "").strip().lower() in TRUE_VALUES


def _home():
    """site-packages: the directory of this file (its spec set __file__)."""
    here = globals().get("__file__") or ""
    cut = max(here.rfind("/"), here.rfind("\\"))
    return here[:cut] if cut > 0 else ""


def boot(home=None):
    """Entry point of the .pth line and of the PEP 829 .start file.

    ``home``: the directory holding ``hotfix/``; site-packages (this file's own)
    unless an editable install's .pth names the checkout (setup.py).
    """
    try:
        if disabled():
            return
        ours = (FirstImportWatch, globals().get("ActivateOnFirstImport", FirstImportWatch))
        if any(isinstance(finder, ours) for finder in sys.meta_path):
            return  # booted twice (.pth and .start both honoured): once is enough
        watch = FirstImportWatch(home or _home())
        sys.meta_path.insert(0, watch)
        if any(name in sys.modules for name in TRIGGERS):
            finder = watch.take_over()  # a trigger was imported before this hook ran (rare): nothing to arm
            if finder is not None:
                finder.activate_when_possible()
    except Exception as exc:  # never break interpreter start-up
        _say("boot failed, continuing without hotfix: %r" % (exc,))
