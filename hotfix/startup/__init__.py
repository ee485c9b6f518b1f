"""How hotfix starts: the start-up hook and what follows a module's import.

    boot          the start-up hook (standard library only; loaded by its path as ``_hotfix_boot``): the
                  finder that activates hotfix on the first import of a trigger, the loader proxy and the
                  finder loop, the start-up files and their .pth line, HOTFIX_DISABLE's true values
    reload_watch  re-applies fixes after ``importlib.reload`` of a target (boot's proxy and loop)
    status        is the start-up hook in effect in this interpreter (``hotfix status``)
"""
