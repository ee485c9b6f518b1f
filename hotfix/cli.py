"""Command line: ``hotfix status`` (default), ``hotfix doctor``.

``python -m hotfix`` is the same command.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

from hotfix.config import DISABLE_VAR, DISABLED_PATCHES_VAR
from hotfix.registry import registry
from hotfix.versions import REPORTED_LIBRARIES, installed_version


def _import_targets(patches) -> dict:
    """Import each installed target so `status` can say what is applied.

    A target that refuses to import here (unsloth_zoo without a GPU, say) is
    reported, not raised.
    """
    problems = {}
    for patch in patches.values():
        for target in patch.targets:
            top = target.split(".")[0]
            if installed_version(top.replace("_", "-"), top) is None or target in sys.modules:
                continue
            try:
                importlib.import_module(target)
            except BaseException as exc:  # some libraries raise SystemExit without a GPU
                problems[target] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return problems


def status(import_targets: bool = True, out=None) -> int:
    out = out or sys.stdout
    import hotfix

    write = lambda text="": print(text, file=out)  # noqa: E731
    patches = registry.patches()
    problems = _import_targets(patches) if import_targets and registry.active else {}
    write(f"hotfix {hotfix.__version__} (distribution hotfix-checkpoint)  {'active' if registry.active else 'INACTIVE'}")
    write()
    write("libraries:")
    for dist, module in REPORTED_LIBRARIES.items():
        write(f"  {dist:<13} {installed_version(dist, module) or 'not installed'}")
    write()
    write("opt-out:")
    write(f"  {DISABLE_VAR}={os.environ.get(DISABLE_VAR, '')!r}" + ("  -> hotfix disabled" if registry.settings.disabled else ""))
    write(f"  {DISABLED_PATCHES_VAR}={os.environ.get(DISABLED_PATCHES_VAR, '')!r}")
    for name, error in registry.load_errors.items():
        write(f"  plugin {name!r} failed to load: {error}")
    write()
    write("patches:")
    for key, patch in sorted(patches.items()):
        verdict = patch.check()
        if registry.is_opted_out(patch):
            state = "opted out"
        elif patch.applied:
            state = "APPLIED to " + ", ".join(patch.applied_targets)
        elif not verdict.applies:
            state = "not needed here"
        elif patch.last_error:
            state = patch.last_error
        elif any(t in problems for t in patch.targets):
            state = "target failed to import: " + "; ".join(problems[t] for t in patch.targets if t in problems)
        elif not registry.active:
            state = "not applied (hotfix inactive)"
        else:
            state = "waiting for " + ", ".join(patch.targets) + " to be imported"
        write(f"  {patch.name}: {state}")
        write(f"    fixes:    {patch.symptom}")
        details = getattr(patch, "details", "")
        if details:
            write(f"    covers:   {details}")
        write(f"    here:     {'applies' if verdict.applies else 'does not apply'}: {verdict.reason}")
        write(f"    upstream: {patch.upstream}; fixed in: {patch.fixed_in or 'no release yet'}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="hotfix", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    p_status = sub.add_parser("status", help="versions, known patches, what is applied here")
    p_status.add_argument("--no-import", action="store_true",
                          help="do not import target libraries (faster; shows pending patches)")
    sub.add_parser("doctor", help="reproduce the Whisper bug here without and with hotfix")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from hotfix.doctor import main as doctor_main

        return doctor_main([])
    return status(import_targets=not getattr(args, "no_import", False))


if __name__ == "__main__":
    sys.exit(main())
