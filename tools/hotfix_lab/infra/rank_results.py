"""The lab's torchrun case scripts (ddp_cases.py, wrapper_cases.py, deepspeed_cases.py, a test's own) and their
launchers (tests, census tools, benchmarks): both sides of one file protocol.

A case script takes its output folder first, runs each case (a failing one recorded as its short error), writes
RESULT_DIR/rank<N>.json per rank (``{"rank": N, ...}``: ranks share stdout, where lines can interleave), waits for
the others (every rank's file is written before any tears its process group down), and leaves without the
runtime's teardown.  A launcher builds its command with ``command`` (torchrun, or one process as rank 0 of 1, on
loopback: ``LOOPBACK``), runs it its own way (timeouts, what a failure means) and reads the files with ``read``.
Imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple


def run_cases(out: Dict, cases: List[str], run: Callable[[str], Dict], short_error: Callable[[BaseException], str],
              barrier: Optional[Callable[[], None]] = None) -> Dict:
    """``out["cases"][case] = run(case)`` for each case, ``{"ok": False, "error": ...}`` where it raises; the ranks
    meet after each case (``barrier``) so that one rank's failure does not leave the other waiting in a collective."""
    for case in cases:
        try:
            out["cases"][case] = run(case)
        except Exception as exc:
            out["cases"][case] = {"ok": False, "error": short_error(exc)}
        if barrier is not None:
            barrier()
    return out


def write_rank_file(result_dir: str, out: Dict, distributed: bool = True) -> None:
    """RESULT_DIR/rank<N>.json; with ``distributed`` every rank's file is written before the process group goes."""
    with open(os.path.join(result_dir, "rank%d.json" % out["rank"]), "w") as handle:
        json.dump(out, handle)
    if distributed:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def leave() -> None:
    """Exit without the interpreter's and the C++ runtime's teardown: a rank of torch 2.13's gloo on CPU can abort
    there ("terminate called without an active exception", SIGABRT) after its results are written and its process
    group destroyed, with and without hotfix alike (CI, 2026-11-27).  Every case ran and was recorded."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------------------------------- the launcher's side
#: a rendezvous on loopback only, one thread per rank (ranks share the machine's cores), no tokenizer threads
LOOPBACK = {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a launcher's rendezvous (``--master_port``, ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(script: Sequence[str], ranks: int = 2, python: str = sys.executable) -> Tuple[List[str], Dict[str, str]]:
    """``(argv, env)`` that run ``script`` (its path and arguments) as ``ranks`` ranks: torchrun for 2 or more,
    one process as rank 0 of 1 for 1, a plain process (no rendezvous) for 0.  ``env`` is LOOPBACK plus, for one
    rank, the variables torchrun would set; the caller adds its own.  ``argv[0]`` is ``python``."""
    env = dict(LOOPBACK)
    if ranks >= 2:
        return [python, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(ranks),
                "--max-restarts", "0", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                *script], env
    if ranks == 1:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_PORT=str(free_port()))
    return [python, *script], env


def read(folder: Path) -> Dict[int, dict]:
    """``{rank: its result}`` from the ``rank*.json`` files in ``folder`` (those that were written)."""
    results = {}
    for path in sorted(Path(folder).glob("rank*.json")):
        result = json.loads(path.read_text())
        results[result["rank"]] = result
    return results
