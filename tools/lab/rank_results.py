"""What every torchrun case script of the lab does around its cases (ddp_cases.py, wrapper_cases.py,
deepspeed_cases.py): run each case, a failing one recorded as its short error; one result file per rank; leave
without the runtime's teardown.

Each rank writes RESULT_DIR/rank<N>.json (ranks share stdout, where lines can interleave), then waits for the
others (every rank's file is written before any tears its process group down).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable, Dict, List, Optional


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
