"""How hotfix starts: the start-up hook and what follows a module's import.

    boot          the start-up hook (standard library only; loaded once per process, by its path, as
                  ``_hotfix_boot``): the start-up names, HOTFIX_DISABLE's true values, the watch that waits for
                  the first import outside the standard library
    activation    the hook's second half, run in ``_hotfix_boot`` at that import: the finder that activates
                  hotfix on the first import of a trigger, the loader proxy and the finder loop
    hook          that module as this process loaded it: the package reads the hook's names from it
    files         the start-up files and their .pth line (setup.py, ``hotfix status``)
    post_import   what follows a target's import: the fixes' post-import hooks
    reload_watch  re-applies fixes after ``importlib.reload`` of a target (boot's proxy and loop)
    state         ``hotfix_state``: the read-only in-process check, shipped at the root of site-packages
    status        is the start-up hook in effect in this interpreter (``hotfix status``)
"""
