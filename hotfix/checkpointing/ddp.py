"""Is a DistributedDataParallel forward running that will search its graph for unused parameters?

The one answer for transformers-ddp-find-unused (which acts only there) and
unsloth-zoo-nonreentrant-offload (which makes a call reentrant there only where that fix is applied).
DDP searches when built with ``find_unused_parameters=True``, without ``static_graph``, and outside
``no_sync()`` (no search that step: the parameters' hooks are not awaited).  Which DDP module's forward
runs is ``DistributedDataParallel._active_ddp_module``, set by DDP around its module's forward (where it
is missing, the DDP fix's drift check says so; here it reads as no DDP forward).
"""

from __future__ import annotations

from typing import Any, Optional

from torch.nn.parallel import DistributedDataParallel

__all__ = ["searching_ddp"]


def searching_ddp() -> Optional[Any]:
    """The DDP module whose forward is running, where it will search the graph for unused parameters; else None."""
    ddp = getattr(DistributedDataParallel, "_active_ddp_module", None)
    if ddp is None or not getattr(ddp, "find_unused_parameters", False) or getattr(ddp, "static_graph", False):
        return None
    return ddp if getattr(ddp, "require_backward_grad_sync", True) else None
