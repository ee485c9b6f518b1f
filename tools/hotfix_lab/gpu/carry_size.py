"""How much a device call carries: the working tree that travels plus the carried folders (limit 64 MiB).

    python -P -m hotfix_lab.gpu.carry_size CARRY_DIR [CARRY_DIR ...] [--limit-mib 64]

What travels is every file git tracks plus untracked files it does not
ignore, and the carried folders (one call's carry list; a part of the kit
carries a subset, tools/hotfix_lab/gpu/parts.py).  Exits 1 (and says so) when over the limit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

LIMIT_MIB = 64


def tree_files(root):
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [os.path.join(root, name) for name in out.split("\0") if name]


def folder_files(folder):
    for base, _, names in os.walk(folder):
        for name in names:
            yield os.path.join(base, name)


def size_of(paths):
    total = 0
    for path in paths:
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total


def check(root, carry, limit_mib=LIMIT_MIB):
    """(tree bytes, carried bytes, within the limit?); ``carry``: one folder or a list of them."""
    carries = [carry] if isinstance(carry, str) else list(carry)
    carried = sorted({path for folder in carries if os.path.isdir(folder) for path in folder_files(folder)})
    carried_set = {os.path.realpath(p) for p in carried}
    tree = [p for p in tree_files(root) if os.path.realpath(p) not in carried_set]
    tree_bytes, carry_bytes = size_of(tree), size_of(carried)
    return tree_bytes, carry_bytes, tree_bytes + carry_bytes <= limit_mib * 2**20


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("carry", nargs="+")
    p.add_argument("--root", default=os.getcwd())
    p.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    args = p.parse_args(argv)
    tree_bytes, carry_bytes, ok = check(args.root, args.carry, args.limit_mib)
    for folder in args.carry:
        for path in sorted(folder_files(folder)) if os.path.isdir(folder) else []:
            print(f"  {os.path.getsize(path) / 2**20:7.2f} MiB  {os.path.relpath(path, args.root)}")
    total = (tree_bytes + carry_bytes) / 2**20
    print(f"carry: {carry_bytes / 2**20:.2f} MiB + working tree {tree_bytes / 2**20:.2f} MiB = {total:.2f} MiB "
          f"(limit {args.limit_mib:g} MiB): {'fits' if ok else 'OVER THE LIMIT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
