"""Print the GPU machine's facts as JSON (device, driver, versions) for the kit's report."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from datetime import datetime, timezone


def main():
    facts = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "python": platform.python_version()}
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
    for name in ("transformers", "peft", "accelerate", "hotfix-checkpoint"):
        try:
            from importlib.metadata import version

            facts[name] = version(name)
        except Exception:
            facts[name] = None
    json.dump(facts, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
