"""The fixes, one module each; installed as ``hotfix.patches``.

Every module defines one ``hotfix.patch.Patch`` subclass and a module-level
``patch`` instance, registered in pyproject.toml under the entry-point group
``hotfix.patches``.  Nothing here is imported until a target module is.
"""
