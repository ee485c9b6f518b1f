"""Print the GPU machine's facts as JSON (device, driver, versions) for the kit's report.

    python -P -m hotfix_lab.gpu.environment [--part NAME] [--site DIR]

Also which hotfix this interpreter imports from the current directory (``hotfix_file``)
and whether its fixes load there (``hotfix_fixes``): a checkout's root on sys.path shadows
the installed wheel with a ``hotfix/`` that has no ``hotfix.patches`` (2026-11-25: every
fix "could not be loaded" and the seed's crash came back), so the kit runs everything
from outside the checkout and records here what was imported.  ``--site``: the folders
the kit installed releases into (``pip --target``), each with the versions it holds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone


def installed_in(folder):
    """{distribution: version} of the dist-info folders directly in ``folder``."""
    found = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".dist-info"):
            dist, _, version = name[: -len(".dist-info")].rpartition("-")
            found[dist] = version
    return found


def hotfix_facts():
    try:
        import hotfix

        facts = {"hotfix_file": hotfix.__file__, "cwd": os.getcwd()}
        facts["hotfix_fixes"] = sorted(hotfix.known_patches())
        from hotfix.registry import registry

        if registry.load_errors:
            facts["hotfix_load_errors"] = dict(registry.load_errors)
        return facts
    except Exception as exc:
        return {"hotfix_file": f"not importable: {exc!r}", "cwd": os.getcwd()}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--part", default=None)
    p.add_argument("--site", default=None)
    args = p.parse_args(argv)
    facts = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "python": platform.python_version()}
    if args.part:
        facts["part"] = args.part
    # hotfix before torch: torch's first import starts an installed hotfix's start-up hook, which loads the copy
    # installed beside it (in a dry run here, the test venv's, not the kit's private one this asks about)
    facts.update(hotfix_facts())
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            facts["device"] = torch.cuda.get_device_name(0)
            facts["device_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        else:
            facts["device"] = "no CUDA device"
    except Exception as exc:
        facts["torch"] = f"not importable: {exc!r}"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        facts["driver"] = smi.stdout.strip() or smi.stderr.strip()
    except Exception as exc:
        facts["driver"] = f"nvidia-smi unavailable: {type(exc).__name__}"
    from importlib.metadata import version

    for name in ("transformers", "peft", "accelerate", "tokenizers", "huggingface-hub", "hotfix-checkpoint"):
        try:
            facts[name] = version(name)
        except Exception:
            facts[name] = None
    if args.site and os.path.isdir(args.site):
        facts["installed"] = {name: installed_in(os.path.join(args.site, name)) for name in sorted(os.listdir(args.site))
                              if os.path.isdir(os.path.join(args.site, name)) and not name.startswith("work")}
    json.dump(facts, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
