"""The start-up files at the root of a site directory, and the .pth line that runs the start-up hook.

Imports nothing: setup.py loads this file by its path to write the files into the wheel (and an editable
install's .pth), and ``hotfix status`` looks for them.  The hook itself (``boot.py``) needs none of it.
"""

PTH_FILE = "hotfix-checkpoint.pth"
START_FILE = "hotfix-checkpoint.start"  # PEP 829 (Python >= 3.15)
BOOT_MODULE = "_hotfix_boot"  # the name the start-up hook is loaded under (hotfix.startup.hook finds it by it)
STARTUP_FILES = (PTH_FILE, START_FILE)
START_ENTRY = BOOT_MODULE + ":boot"


def startup_line(boot_path, home, missing):
    """The .pth line: load the boot module from ``boot_path`` (a Python expression) by its location and run
    ``boot(home)`` (an expression too; None: the boot module's own folder); where that file is gone, write
    ``missing`` (its ``%s`` is the path) as one line instead of a traceback.  In a venv Python reads
    site-packages twice (lib64 -> lib): a second reading does nothing.  One line of expressions (a .pth runs
    single lines), no ``exec`` and no import but of loaded built-ins; ``os`` and ``sitedir`` are site's.  For
    the wheel and for an editable install (setup.py)."""
    return ("import sys, _frozen_importlib as b, _frozen_importlib_external as e; p = %s; n = %r; "
            "s = None if n in sys.modules else e.spec_from_file_location(n, p) if os.path.isfile(p) else "
            "(sys.modules.__setitem__(n, None), sys.stderr.write('hotfix: ' + %r %% p + '\\n'))[0]; "
            "m = s and b.module_from_spec(s); s and sys.modules.__setitem__(n, m); s and s.loader.exec_module(m); "
            "s and m.boot(%s)\n" % (boot_path, BOOT_MODULE, missing, home))
