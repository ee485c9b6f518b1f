"""Where the sweep's rows live: a JSON-lines file, or the tracked store of one gzip file per release line.

The tracked store (``docs/sweep-results/<transformers version>.jsonl.gz``) is the
evidence behind docs/sweep.md.  Each file is written deterministically (gzip
mtime 0, rows in the order of their last writing), so re-compacting unchanged rows
changes no byte and a full sweep run adds kilobytes to git, not megabytes.  A run
appends to an untracked pending file (``.sweep/<store>.pending.jsonl``), so an
interrupted sweep resumes where it stopped; compacting merges it into the store.
Side runs (``--fast``, float64, tests) use a plain JSON-lines file.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Callable, Dict, List


def is_store(path: Path) -> bool:
    return path.suffix != ".jsonl"


def pending_of(store: Path) -> Path:
    return store.parent.parent / ".sweep" / f"{store.name}.pending.jsonl"


def append_target(path: Path) -> Path:
    """The file a running sweep appends its rows to."""
    return pending_of(path) if is_store(path) else path


def _lines(path: Path) -> List[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line.startswith("{")]


def read_lines(path: Path) -> List[str]:
    """Every row's JSON text, store files (by name) first, then what a run appended."""
    if not is_store(path):
        return _lines(path)
    lines: List[str] = []
    for part in sorted(path.glob("*.jsonl.gz")) if path.is_dir() else []:
        with gzip.open(part, "rt") as handle:
            lines += [line for line in handle.read().splitlines() if line.startswith("{")]
    return lines + _lines(pending_of(path))


def _gzip_bytes(text: str) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as handle:
        handle.write(text.encode())
    return buffer.getvalue()


def by_release_line(row: Dict) -> str:
    return row["transformers"]


def write_lines(path: Path, lines: List[str], group: Callable[[Dict], str] = by_release_line) -> None:
    """Replace the rows at ``path``: one gzip file per ``group`` (a release line) in a store, else the JSON-lines file."""
    if not is_store(path):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        tmp.replace(path)  # atomic: a crash here leaves the old file whole
        return
    by_version: Dict[str, List[str]] = {}
    for line in lines:
        by_version.setdefault(group(json.loads(line)), []).append(line)
    path.mkdir(parents=True, exist_ok=True)
    for version, rows in by_version.items():
        target = path / f"{version}.jsonl.gz"
        data = _gzip_bytes("".join(row + "\n" for row in rows))
        if not target.exists() or target.read_bytes() != data:
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(target)
    pending_of(path).unlink(missing_ok=True)


def compact(path: Path, key: Callable[[Dict], tuple], group: Callable[[Dict], str] = by_release_line) -> int:
    """Keep, per ``key``, only the row written last (in the order of last writing); returns how many were dropped."""
    lines = read_lines(path)
    last: Dict[tuple, int] = {}
    for i, line in enumerate(lines):
        last[key(json.loads(line))] = i
    keep = sorted(last.values())
    if len(keep) < len(lines) or (is_store(path) and pending_of(path).exists()):
        write_lines(path, [lines[i] for i in keep], group)
    return len(lines) - len(keep)
