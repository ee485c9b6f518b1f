#!/usr/bin/env python3
"""A library release side by side in .matrix/<name>-<version> (git-ignored, ``pip install --target``), once.

The one installer of the release matrix: scripts/test.sh installs tests/matrix.txt with it, every census tool
through hotfix_lab.census.runner.  What a library needs to install this way is data (NEEDS); every other library is
installed alone (``--no-deps``: its needs are the venv's, or hotfix_lab.infra.fork_loader stubs them).  A folder is
complete once its ``.complete`` marker is written; a half-finished one is installed again.  A failed install
raises (from the command line: exit status 1), naming pip's last line.

    python -P -m hotfix_lab.infra.matrix_install NAME VERSION [NAME VERSION ...]
    python -P -m hotfix_lab.infra.matrix_install --beside-torch LINE

``--beside-torch``: BESIDE_TORCH's libraries for a side torch's venv (.matrix/torch-LINE, hotfix_lab.census.census
``--install-torch``), installed by that venv's pip into .matrix/timm-torchLINE.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Mapping, Tuple

from hotfix_lab.infra.paths import REPO

MATRIX = REPO / ".matrix"


@dataclass(frozen=True)
class Needs:
    #: install what the release requires (transformers: tokenizers, huggingface_hub, ... at its pins)
    dependencies: bool = False
    #: install what the release requires that the venv lacks, the venv's HELD packages kept at their versions
    #: (resolved by pip against the venv, then installed without dependencies: no second torch in the folder)
    beside_venv: bool = False
    #: environment of the build; with it the build sees the venv's packages (no isolation, nothing downloaded)
    build_env: Mapping[str, str] = field(default_factory=dict)
    #: (major, minor) line -> requirements its install needs first, into the same folder (--no-deps leaves them out)
    pins: Mapping[Tuple[int, int], Tuple[str, ...]] = field(default_factory=dict)
    #: install where the release's metadata asks a newer Python than the lab's: only for files the lab loads by path
    #: that run on its Python (axolotl 0.20+ asks >= 3.12; its checkpointing files parse and run on 3.11)
    any_python: bool = False


#: what a beside-venv install never puts in its folder in another version: the packages whose version is what the
#: tests measure (torch, transformers and what transformers pins at import), and hotfix's own dependencies
HELD = ("torch", "transformers", "huggingface-hub", "tokenizers", "safetensors", "numpy", "accelerate", "peft",
        "wrapt", "packaging")

NEEDS: Dict[str, Needs] = {
    "transformers": Needs(dependencies=True),
    # the first-import census (tools/hotfix_lab/census/first_import.py): libraries a script imports before transformers
    **{name: Needs(beside_venv=True) for name in (
        "trl", "diffusers", "optimum", "sentence-transformers", "datasets", "evaluate", "lightning", "liger-kernel",
        "bitsandbytes")},
    # PyPI has DeepSpeed as an sdist only: built without its C++ ops (its CPU accelerator needs none); the 0.10
    # line's setup.py imports deepspeed, whose config code is pydantic 1's (0.10 requires pydantic<2.0.0)
    "deepspeed": Needs(build_env={"DS_BUILD_OPS": "0"}, pins={(0, 10): ("pydantic<2.0.0",)}),
    # tools/hotfix_lab/infra/fork_loader.py loads its checkpointing package alone
    "axolotl": Needs(any_python=True),
}
#: what runs only beside one torch, by its line: PyPI's torchvision is built for one torch release (none exists for
#: the test venv's CPU torch 2.13.0), and timm and open_clip import it.  Into .matrix/timm-torch<line> with the
#: side torch's own pip, without dependencies (the pure-Python needs the side venv lacks are listed; pillow:
#: torchvision imports PIL).  Used by tests/e2e/test_torch_only_ddp.py and the first-import census.
BESIDE_TORCH: Dict[str, Tuple[str, ...]] = {
    "2.11.0": ("torchvision==0.26.0", "timm==1.0.31", "open_clip_torch==3.3.0", "ftfy==6.3.1", "wcwidth==0.9.4",
               "pillow==13.0.0"),
}
#: PyPI names that differ from tests/matrix.txt's
DISTRIBUTION = {"unsloth-zoo": "unsloth_zoo"}


def folder_of(name: str, version: str) -> Path:
    return MATRIX / f"{name}-{version}"


def install(name: str, version: str) -> Path:
    """``name==version`` in .matrix/<name>-<version>, unless already complete there; returns the folder."""
    folder = folder_of(name, version)
    if (folder / ".complete").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    needs = NEEDS.get(name, Needs())
    spec = f"{DISTRIBUTION.get(name, name)}=={version}"
    print(f"installing {spec} into {folder.relative_to(REPO)}", flush=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(folder),
           *([] if needs.dependencies else ["--no-deps"]), *(["--ignore-requires-python"] if needs.any_python else [])]
    env = dict(os.environ)
    line = tuple(int(part) for part in version.split(".")[:2])
    if needs.pins.get(line):
        _pip([*pip, *needs.pins[line]], env, spec)
        env["PYTHONPATH"] = str(folder)  # the build imports them from there
    if needs.build_env:
        env.update(needs.build_env)
        pip.append("--no-build-isolation")
    _pip([*pip, *(_missing_from_venv(spec, env) if needs.beside_venv else [spec])], env, spec)
    (folder / ".complete").touch()
    return folder


def beside_torch_folder(line: str) -> Path:
    return MATRIX / f"timm-torch{line}"


def install_beside_torch(line: str) -> Path:
    """BESIDE_TORCH[line] into :func:`beside_torch_folder`, unless complete there, with .matrix/torch-<line>'s pip."""
    folder = beside_torch_folder(line)
    if (folder / ".complete").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    python = MATRIX / f"torch-{line}" / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{python.parent.parent} is not installed (python -P -m hotfix_lab.census.census --install-torch {line})")
    print(f"installing {' '.join(BESIDE_TORCH[line])} into {folder.relative_to(REPO)}", flush=True)
    _pip([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--target",
          str(folder), *BESIDE_TORCH[line]], os.environ, f"the libraries beside torch {line}")
    (folder / ".complete").touch()
    return folder


def _missing_from_venv(spec: str, env: Mapping[str, str]) -> list:
    """``spec`` and every requirement of it the venv lacks, as pip resolves them with the venv's packages pinned."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        pins, report = Path(scratch) / "venv.txt", Path(scratch) / "report.json"
        frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--disable-pip-version-check"],
                                capture_output=True, text=True, check=True).stdout
        pins.write_text("".join(line + "\n" for line in frozen.splitlines()
                                if line.partition("==")[0].lower().replace("_", "-") in HELD))
        _pip([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--dry-run",
              "--report", str(report), "-c", str(pins), spec], env, spec)
        wanted = json.loads(report.read_text())["install"]
    return [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in wanted]


def _pip(command: list, env: Mapping[str, str], spec: str) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, env=dict(env))
    if proc.returncode != 0:
        raise RuntimeError(f"pip install {spec} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")


def main(argv: list) -> int:
    beside = argv[:1] == ["--beside-torch"] and len(argv) == 2
    if not beside and (not argv or len(argv) % 2):
        print(__doc__.strip().split("\n\n")[2], file=sys.stderr)
        return 2
    try:
        if beside:
            install_beside_torch(argv[1])
        for name, version in ([] if beside else zip(argv[::2], argv[1::2])):
            install(name, version)
    except RuntimeError as exc:
        print(f"matrix_install: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
