"""The start-up hook's second half: the finder that activates hotfix, and hotfix's loading.

Not a module of its own: ``boot.complete`` runs this file in the boot module's namespace (``_hotfix_boot``) the
first time a process imports a module outside the standard library (before that, ``boot.FirstImportWatch`` stands
in sys.meta_path and answers every look-up with None).  So a process that imports only the standard library
(``python -c pass``, pip's subprocesses) never loads it, and the names below read the boot module's (``TRIGGERS``,
``PACKAGE``, ``_say`` ...) as their own.  Imports nothing but ``sys`` and ``_thread``, as the first half:

* one finder at the front of ``sys.meta_path`` that imports nothing under the import lock: for a trigger it
  hands back the spec the finders behind it give, its loader wrapped; the first spec *executed* activates
  hotfix (a look-up that never executes one, ``importlib.util.find_spec``, leaves the next one to do it);
* activation never runs while a module activation needs is half made in this thread (it is put off to the
  next top-level import); with third-party fixes, the first import outside the standard library activates;
* hotfix is loaded from the folder the hook names as its home: a ``hotfix`` of the user's earlier on sys.path is
  never executed, a damaged install is one line on stderr.

The long story: docs/design.md ("Start-up and activation").
"""

import sys
import _thread

if False:  # never runs (compiled away): the boot module's names this file uses, for readers and linters; at run time
    # this file runs in that module's namespace (module docstring), and they are there (tests/unit/test_state_constants.py)
    from hotfix.startup.boot import (CHECKPOINT_FUNCTION, CHECKPOINT_GENERATOR, CHECKPOINT_MODULE, DDP_CLASS,  # noqa
                                     DDP_MODULE, DISTRIBUTION, ENTRY_POINT_GROUP, MARKER, OWN_IMPORTS, PACKAGE, REINSTALL,
                                     STANDARD_LIBRARY, STARTUP_NAMES, TRIGGERS, WATCHED, _say)


_INHERITED = object()  # a watched attribute the owner does not define itself (inherited from a base)


class LoaderProxy:
    """A module's loader, handed back by a finder in its place: runs the real loader around ``before`` /
    ``after`` (``failed`` where its code raised), and leaves no trace of itself on the module."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The import system stored this proxy as the module's loader: it is the real loader's.
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "loader", None) is self:
            spec.loader = self._loader
        self.before(module)
        try:
            self._loader.exec_module(module)
        except BaseException:
            self.failed(module)
            raise
        self.after(module)

    def before(self, module):
        pass

    def after(self, module):
        pass

    def failed(self, module):
        pass


def spec_behind(finder, fullname, path=None, target=None):
    """The spec the finders behind ``finder`` in ``sys.meta_path`` give (every finder where it is not there),
    passing over the finders of its own class; None where none finds ``fullname``."""
    finders = list(sys.meta_path)
    start = finders.index(finder) + 1 if finder in finders else 0
    for other in finders[start:]:
        find_spec = getattr(other, "find_spec", None)
        if find_spec is None or isinstance(other, type(finder)):
            continue
        spec = find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def wrappable(spec):
    """Can a :class:`LoaderProxy` stand in for this spec's loader?"""
    return spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module")


class _ActivateAroundExec(LoaderProxy):
    """Loader proxy of a first import: activate hotfix before (a trigger) or after its code runs."""

    def __init__(self, loader, finder, trigger):
        super().__init__(loader)
        self._finder = finder
        self._trigger = trigger

    def before(self, module):
        if self._trigger:
            self._finder.executing.add(self._trigger)
            if self._finder.can_activate():
                self._finder.activate()  # before the trigger's code: its submodules find the fixes' hooks in place

    def failed(self, module):
        self._finder.executing.discard(self._trigger)
        self._finder.put_off()  # the module is half made until the import system drops it

    def after(self, module):
        self._finder.executing.discard(self._trigger)
        self._finder.activate_when_possible()


class _WatchAfterExec(LoaderProxy):
    """Loader proxy of torch's import, or of its checkpoint module's (no trigger imported yet): once the module ran,
    ``watch(module)`` puts the watches on it (``WATCHED``)."""

    def __init__(self, loader, watch):
        super().__init__(loader)
        self._watch = watch

    def after(self, module):
        self._watch(module)


class ActivateOnFirstImport:
    """A meta path finder that finds nothing itself; it hands out the first imports' specs with an activating loader.

    Every spec it hands out before activation carries the activation, and the
    first one *executed* activates: a look-up that never executes its spec
    (``importlib.util.find_spec``, ``pkgutil.find_loader``, a probe in another
    thread, a parent's probe before a fork) leaves the next one to do it.
    Where a trigger was loaded past it (a finder ahead of this one that loads
    transformers itself, this finder moved back in ``sys.meta_path``), the next
    import it sees activates hotfix late, as ``import hotfix`` after transformers
    does, and says so at INFO.

    It stays in sys.meta_path afterwards (as a cheap no-op): removing a
    finder while the import system iterates over sys.meta_path would make it
    skip the next finder for that one import.
    """

    def __init__(self, home):
        self.home = home  # the site-packages directory holding this file and hotfix/
        self.due = False  # the activation was put off: the next top-level import carries it, whatever it is
        self.finished = False
        self.executing = set()  # triggers whose code runs under one of this finder's loaders
        self.bypassed = None  # "transformers (loaded by SomeLoader)": a trigger imported past this finder
        self._searching = set()  # thread ids inside our own find_spec (finders may recurse)
        self._third_party = None  # unknown until the first top-level import outside the standard library
        self._once = _thread.allocate_lock()  # two threads' first imports (transformers, unsloth) activate once
        self._watches = []  # (owner, name, torch's object, the watch standing in its place), while watching
        self._checkpoint_due = False  # torch imported without its checkpoint module: watch it once it runs

    def find_spec(self, fullname, path=None, target=None):
        if self.finished or target is not None:
            return None
        if path is not None:  # a submodule: only torch's checkpoint module, where it is to be watched
            if fullname == CHECKPOINT_MODULE and self._checkpoint_due:
                return self._spec_behind(fullname, lambda loader: _WatchAfterExec(loader, self.watch_checkpoint),
                                         path)
            return None
        if fullname == PACKAGE:
            return None  # importing hotfix activates it; its own imports are put off (can_activate)
        if self.bypassed is None and not self.due:
            self._notice_bypass()
        if fullname == WATCHED and not self.due and not self._third_party_fixes_installed():
            # (with third-party fixes torch's import carries the activation itself, below)
            return self._spec_behind(fullname, lambda loader: _WatchAfterExec(loader, lambda torch: self.watch_torch()))
        if fullname not in TRIGGERS and not self.due and (
                fullname in STARTUP_NAMES or fullname in STANDARD_LIBRARY or not self._third_party_fixes_installed()):
            return None
        trigger = fullname if fullname in TRIGGERS else None
        return self._spec_behind(fullname, lambda loader: _ActivateAroundExec(loader, self, trigger))

    def _spec_behind(self, fullname, proxy, path=None):
        """The spec the finders behind this one give for ``fullname`` (``path``: its package's, for a submodule),
        its loader wrapped by ``proxy(loader)``; None where none is found or its loader cannot be wrapped (the import
        system goes on)."""
        me = _thread.get_ident()
        if me in self._searching:
            return None
        self._searching.add(me)
        try:
            spec = spec_behind(self, fullname, path)
        finally:
            self._searching.discard(me)
        if not wrappable(spec):
            return None
        spec.loader = proxy(spec.loader)
        return spec

    def watch_torch(self):
        """Put the watches on torch's DDP ``__init__``, its non-reentrant checkpoint generator and its reentrant
        ``CheckpointFunction.apply`` (the module comment at ``WATCHED``); never raises.  Each is a plain function (the
        last a classmethod of one) in the original's place: its first call takes every watch away, activates hotfix,
        and calls what stands there then (a fix's wrapper, where one applied).  Where torch's import did not import its
        checkpoint module (torch 2.7 does not; 2.11 does), the checkpoint's watches are put once that module has run
        (``find_spec``: its loader wrapped, nothing imported here)."""
        if self.finished or self._watches or self._checkpoint_due:
            return
        ddp = getattr(sys.modules.get(DDP_MODULE), DDP_CLASS, None)
        if isinstance(ddp, type) and ddp.__dict__.get("__init__") is not None:
            def __init__(instance, *args, **kwargs):
                self._activate_on_call()
                return ddp.__init__(instance, *args, **kwargs)

            self._watch(ddp, "__init__", __init__)
        checkpoint = sys.modules.get(CHECKPOINT_MODULE)
        if checkpoint is None:
            self._checkpoint_due = True
        else:
            self.watch_checkpoint(checkpoint)

    def watch_checkpoint(self, checkpoint):
        """The watches on ``checkpoint``'s (torch's module's) generator and its reentrant Function's ``apply``; never
        raises."""
        self._checkpoint_due = False
        found = getattr(checkpoint, "__dict__", {})
        if self.finished:
            return
        if callable(found.get(CHECKPOINT_GENERATOR)):
            def first_non_reentrant_checkpoint(*args, **kwargs):
                self._activate_on_call()
                return checkpoint.__dict__[CHECKPOINT_GENERATOR](*args, **kwargs)

            self._watch(checkpoint, CHECKPOINT_GENERATOR, first_non_reentrant_checkpoint)
        function = found.get(CHECKPOINT_FUNCTION)
        if isinstance(function, type) and callable(getattr(function, "apply", None)):
            def first_reentrant_checkpoint(cls, *args, **kwargs):
                self._activate_on_call()
                return cls.apply(*args, **kwargs)  # what stands once the watch is gone: torch's, or the fixes'

            self._watch(function, "apply", first_reentrant_checkpoint, classmethod)

    def _watch(self, owner, name, installed, kind=None):
        """``installed`` (made a ``kind``, a classmethod, where given) in the place of ``owner.name`` until
        :meth:`unwatch_torch`; one line where it cannot be.  An attribute ``owner`` inherits (``apply``: torch's
        ``Function``'s) goes again from ``owner``'s own namespace."""
        try:
            original = owner.__dict__.get(name, _INHERITED)
            installed.__wrapped__ = original if original is not _INHERITED else getattr(owner, name)
            standing = kind(installed) if kind is not None else installed
            setattr(owner, name, standing)
            self._watches.append((owner, name, original, standing))
        except Exception as exc:  # never break torch's import
            _say("could not watch torch's %s.%s (%r); a torch-only script needs `import hotfix`"
                 % (getattr(owner, "__name__", owner), name, exc))

    def _activate_on_call(self):
        self.unwatch_torch()  # torch's own objects back in place before hotfix applies its fixes
        self.activate_when_possible()

    def finish(self):
        """hotfix is active, however it came to be (``import hotfix`` before or after torch, a trigger): nothing is
        left to activate.  The watches come off torch's objects and none is put later: put by a later ``import
        torch`` over the fixes' wrappers, a watch kept them from a revert (its first call put them back)."""
        self.finished = True
        self.unwatch_torch()

    def unwatch_torch(self):
        watches, self._watches = self._watches, []
        self._checkpoint_due = False
        for owner, name, original, installed in watches:
            if owner.__dict__.get(name) is installed:
                if original is _INHERITED:
                    delattr(owner, name)
                else:
                    setattr(owner, name, original)

    def _notice_bypass(self):
        """A trigger in sys.modules whose code did not run under this finder's loader was loaded past it:
        the next import carries the activation (fixes attach to loaded modules as after ``import hotfix``).

        Where this finder was moved behind the finders that load modules (only imports nobody finds reach it
        there), it moves itself back to the front, where start-up put it, so that the next import reaches it.
        The import system is iterating over sys.meta_path right now: taking this finder out and putting it at
        the front shifts no finder that comes after it, so this import asks each of them as it would have."""
        for name in TRIGGERS:
            module = sys.modules.get(name)
            # a module made by hand and put in sys.modules (no __spec__: a stand-in, a test's stub) was never
            # imported: not a bypass
            if module is not None and name not in self.executing and getattr(module, "__spec__", None) is not None:
                loader = getattr(getattr(module, "__spec__", None), "loader", None)
                self.bypassed = "%s (loaded by %s)" % (name, type(loader).__name__ if loader else "no loader")
                self.due = True
                if sys.meta_path and sys.meta_path[0] is not self:
                    try:
                        sys.meta_path.remove(self)
                    finally:
                        sys.meta_path.insert(0, self)
                return

    def _third_party_fixes_installed(self):
        """Does an installed distribution other than hotfix-checkpoint declare fixes?

        Read once per process, at its first top-level import of a module outside the
        standard library after start-up (never
        during start-up itself): plain file reads of ``entry_points.txt``, no
        import, so it is safe under the import lock.
        """
        if self._third_party is None:
            if _running_module(lambda name, filename: name == "site"):
                return False  # interpreter start-up: sys.path is not final yet, read it at the next import
            self._third_party = False
            try:
                self._third_party = _declares_third_party_fixes(sys.path)
            except Exception:
                pass
        return self._third_party

    def can_activate(self):
        """True unless a module that activation imports is half made in this thread (module docstring).  A
        trigger still running its code is no reason: each fix waits for its target's import to finish."""
        return _running_module(_needed_by_hotfix) is None

    def put_off(self):
        """Not now: the next top-level import, whichever it is, carries the activation."""
        if not self.finished:
            self.due = True

    def activate_when_possible(self):
        if self.finished:
            return
        if self.can_activate():
            self.activate()
        else:
            self.put_off()

    def activate(self):
        """Load hotfix from ``home`` (importing it activates it); never raises."""
        with self._once:
            if self.finished:
                return
            self.finished = True
        self.unwatch_torch()
        try:
            loaded = load_hotfix(self.home)
            if loaded and self.bypassed:
                import logging  # hotfix is loaded: logging is

                logging.getLogger(PACKAGE).info(
                    "hotfix: activated after %s was imported past its start-up finder (a finder ahead of it in "
                    "sys.meta_path, or it was moved back); the fixes attached to the loaded modules, as after "
                    "`import hotfix`", self.bypassed)
        except Exception as exc:
            _say("auto-activation failed, continuing without hotfix: %r" % (exc,))


def _running_module(wanted):
    """The innermost module whose body is running in this thread and ``wanted(name, filename)``, or None.

    A module body is a ``<module>`` frame; its globals are the module's.  Only this
    thread's stack counts: a module another thread is importing is behind that
    thread's module lock, which an import here waits for (it never sees the half).
    """
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "<module>":
            name = frame.f_globals.get("__name__")
            if isinstance(name, str) and wanted(name, code.co_filename):
                return name
        frame = frame.f_back
    return None


def _needed_by_hotfix(name, filename):
    """May activation import this module: standard library, hotfix's dependencies, hotfix?"""
    top = name.partition(".")[0]
    if top in OWN_IMPORTS:
        return True
    if STANDARD_LIBRARY:  # Python >= 3.10
        return top in STANDARD_LIBRARY
    import os  # Python 3.9 (already loaded by site): the standard library is os.py's folder, less site-packages

    lib = os.path.dirname(os.__file__)
    return filename.startswith(lib + os.sep) and "-packages" not in filename[len(lib):]


def canonical_name(name):
    """A distribution name as packaging's ``canonicalize_name`` writes it (PEP 503), without importing it."""
    name = name.lower().replace("_", "-").replace(".", "-")
    while "--" in name:
        name = name.replace("--", "-")
    return name


def is_third_party(distribution):
    """Is ``distribution`` (a name as metadata or a .dist-info folder spells it) another than hotfix-checkpoint?
    The one rule: the start-up hook's scan and the registry (which names a fix's source) both ask it."""
    return canonical_name(distribution or "") != DISTRIBUTION


def _listing(entry):
    """The names in the folder ``entry`` of sys.path: the listing Python's path finder keeps for it
    (``FileFinder._path_cache``), or where it has none yet, the folder listed here."""
    import os  # already loaded by site

    finder = sys.path_importer_cache.get(entry or os.getcwd())  # PathFinder keys '' by the current folder
    names = getattr(finder, "_path_cache", None)
    if isinstance(names, (set, frozenset)) and getattr(finder, "_path_mtime", -1) != -1:
        return names
    try:
        return os.listdir(entry or ".")
    except OSError:
        return ()


def _metadata_folders(names):
    """The ``*.dist-info`` / ``*.egg-info`` names among ``names``, found by C-level string search: a folder of
    100,000 files costs one join, not a Python loop over each name."""
    text = "\n" + "\n".join(names) + "\n"
    found = []
    for suffix in (".dist-info\n", ".egg-info\n"):
        end = text.find(suffix)
        while end != -1:
            start = text.rfind("\n", 0, end) + 1
            found.append(text[start:end + len(suffix) - 1])
            end = text.find(suffix, end + 1)
    return found


def _distribution_of(folder):
    """The distribution a metadata folder belongs to, as its name spells it (``name-1.0.dist-info``, ``name.egg-info``)."""
    return folder.rsplit(".", 1)[0].partition("-")[0]


def _declares_third_party_fixes(paths):
    import os  # already loaded by site

    section = ("[%s]" % ENTRY_POINT_GROUP).encode()
    for entry in paths:
        for folder in _metadata_folders(_listing(entry)):
            if not is_third_party(_distribution_of(folder)):
                continue
            try:
                with open(os.path.join(entry or ".", folder, "entry_points.txt"), "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            if section not in data:
                continue
            declared = data.split(section, 1)[1].split(b"\n[", 1)[0]
            if any(line.partition(b"=")[2].strip() for line in declared.splitlines()):
                return True
    return False


def _head(path):
    with open(path, "rb") as handle:
        return handle.read(4096)


def _is_ours(init):
    try:
        return MARKER in _head(init)
    except OSError:
        return False


def load_hotfix(home):
    """Import the hotfix package that lives in ``home``, whatever else is on sys.path; True where this call loaded it."""
    import os  # already loaded by site; imported here so that boot() imports nothing

    package_dir = os.path.join(home, PACKAGE)
    init = os.path.join(package_dir, "__init__.py")
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        where = getattr(loaded, "__file__", None)
        if getattr(loaded, "DISTRIBUTION", None) == DISTRIBUTION or (where and _is_ours(where)):
            # `import hotfix` came first (installed, or a source checkout): it activates hotfix, if it has
            # not yet (still running, its names are not all there: its file says whose it is)
            return
        _say("a different module named 'hotfix' is already imported (%s); %s in %s is not active in this "
             "process. Rename that module to use both." % (where or loaded, DISTRIBUTION, package_dir))
        return
    try:
        head = _head(init)
    except OSError:
        _say("%s is damaged: %s is missing (uninstalling another distribution named 'hotfix' deletes it); "
             "continuing without hotfix. Repair: %s" % (DISTRIBUTION, init, REINSTALL))
        return
    if MARKER not in head:
        _say("%s is damaged: %s belongs to another distribution named 'hotfix'; continuing without hotfix. "
             "Repair: %s" % (DISTRIBUTION, init, REINSTALL))
        return

    import _frozen_importlib as bootstrap
    import _frozen_importlib_external as external

    found = external.PathFinder.find_spec(PACKAGE)  # what a plain `import hotfix` would load
    shadow = None
    if found is not None and found.origin and os.path.realpath(found.origin) != os.path.realpath(init):
        # hotfix-checkpoint's own source checkout first on sys.path (a script run from the checkout's
        # root) is passed over in silence: the installed copy runs, as it does from anywhere else.
        if not _is_ours(found.origin):
            shadow = found.origin
    elif found is not None and not found.origin:  # a namespace directory earlier on sys.path
        shadow = ", ".join(found.submodule_search_locations or ()) or "a namespace package"
    spec = external.PathFinder.find_spec(PACKAGE, [home])
    if spec is None:
        _say("%s could not be located in %s; continuing without hotfix. Repair: %s" % (DISTRIBUTION, home, REINSTALL))
        return
    bootstrap._load(spec)  # the import system's own locked load: sys.modules['hotfix'] is ours
    if shadow:
        _say("%s shadows the installed %s; hotfix was loaded from %s instead, so in this process "
             "`import hotfix` returns %s, not that file. Rename it to use both." % (shadow, DISTRIBUTION, package_dir, DISTRIBUTION))
    return True
