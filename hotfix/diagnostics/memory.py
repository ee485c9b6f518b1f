"""Memory figures of this process and machine, and byte sizes as people write them.

One reader for RSS (the checker's guard, the tests' case runner, the
benchmarks) instead of one per tool.
"""

from __future__ import annotations

import gc
import os
from typing import Optional


def rss_bytes() -> Optional[int]:
    """Resident set size of this process, or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def proc_kib_field(path: str, field: str) -> Optional[int]:
    """Bytes of a ``Field:  <n> kB`` line of a /proc file (``/proc/meminfo``, ``/proc/self/status``), or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except Exception:
        pass
    return None


def available_bytes() -> Optional[int]:
    found = proc_kib_field("/proc/meminfo", "MemAvailable")
    if found is not None:
        return found
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:
        return None


def release_memory() -> None:
    """gc, then hand freed heap back to the OS (glibc) so RSS reflects what is live."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except Exception:
        pass


def default_memory_limit() -> int:
    """min(50% of the memory available now, 8 GiB): RSS growth allowed per step."""
    cap = 8 * 2**30
    avail = available_bytes()
    return cap if avail is None else int(min(avail * 0.5, cap))


def parse_bytes(text: str) -> int:
    """'4GiB', '512M', '1.5G', '1000000' -> bytes (binary units)."""
    s = str(text).strip().lower().replace(" ", "")
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    for suffix in ("ib", "b"):
        if s.endswith(suffix) and len(s) > len(suffix) and s[-len(suffix) - 1] in units:
            s = s[: -len(suffix)]
            break
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(float(s))


def fmt_bytes(n: Optional[int]) -> str:
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024.0
    return f"{sign}{n} B"  # pragma: no cover
