"""The start-up files at the root of a site directory, and the .pth line that runs the start-up hook.

Imports nothing: setup.py loads this file by its path to write the files into the wheel (and an editable
install's .pth), and ``hotfix status`` looks for them.  The hook itself (``boot.py``) needs none of it.
"""

PTH_FILE = "hotfix-checkpoint.pth"
START_FILE = "hotfix-checkpoint.start"  # PEP 829 (Python >= 3.15)
BOOT_MODULE = "_hotfix_boot"  # the name the start-up hook is loaded under (hotfix.startup.hook finds it by it)
STARTUP_FILES = (PTH_FILE, START_FILE)
START_ENTRY = BOOT_MODULE + ":boot"


def startup_line(spec, where, home, missing):
    """The .pth line: run the boot module and its ``boot(home)``.  ``spec``: a Python expression giving the boot
    module's spec by location, or a false value where its file is gone, then ``missing`` (its ``%s`` is
    ``where``, an expression) is written as one line instead of a traceback; ``home``: an expression, None for
    the boot module's own folder.  In a venv Python reads site-packages twice (lib64 -> lib): a second reading
    does nothing.  One line of expressions (a .pth runs single lines) importing only loaded built-ins; ``sys``,
    ``os`` and ``sitedir`` are site's.  Short on purpose: Python compiles it at every start, and its parse was
    most of the hook's start-up cost (docs/performance.md, "start-up").  ``_load`` (importlib's own: module made
    from the spec, put in sys.modules, executed) is private, but there from Python 3.4 to 3.15 (3.15 runs the
    ``.start`` file instead of this line); tests/unit/test_startup_line.py checks it is there."""
    return ("import _frozen_importlib as b, _frozen_importlib_external as e; "
            "s = %r not in sys.modules and (%s or sys.modules.setdefault(%r, sys.stderr.write(%r %% %s) and None)); "
            "s and b._load(s).boot(%s)\n" % (BOOT_MODULE, spec, BOOT_MODULE, "hotfix: " + missing + "\n", where, home))


def wheel_line(missing):
    """The wheel's line: the boot module looked up by name in the site directory holding the .pth alone (never on
    sys.path, where a user's file of that name could come first)."""
    return startup_line("e.PathFinder.find_spec(%r, [sitedir])" % BOOT_MODULE, "sitedir", "None", missing)


def editable_line(boot_path, home, missing):
    """An editable install's line: the checkout's boot.py by its path (``boot_path``, ``home``: strings)."""
    return startup_line("os.path.isfile(%r) and e.spec_from_file_location(%r, %r)" % (boot_path, BOOT_MODULE, boot_path),
                        repr(boot_path), repr(home), missing)
