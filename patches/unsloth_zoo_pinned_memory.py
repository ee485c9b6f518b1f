"""unsloth-zoo 2024.11.6 - 2026.9.4: the offload set-up pins host memory with no fallback.

What breaks: ``initialize_unsloth_gradient_checkpointing`` (run when unsloth sets up its smart gradient
checkpointing) allocates its host buffers with ``torch.empty(..., pin_memory=True)``: 200 of 128 Ki elements from
2025.1.1, one before.  Where the system refuses page-locked memory (WSL2, where pinned memory is scarce: "CUDA error:
out of memory" on a nearly empty GPU, unslothai/unsloth-zoo#1257) the set-up raises and training never starts.
2026.9.5 falls back to pageable memory.  The offload's own growth of a buffer pins too: there hotfix's offload pool
replaces unsloth's (unsloth-zoo-offload-backward, which falls back) up to 2026.8.10; on 2026.8.11 - 2026.9.4
unsloth's own forward still pins its grown buffers: NOT COVERED.

How this fixes it: ``initialize_unsloth_gradient_checkpointing`` is wrapped (wrapt); for that call only, the
module's ``torch`` is a stand-in whose ``empty(..., pin_memory=True)`` makes a pageable buffer where pinning is
refused (every other name is torch's own), and the module's ``torch`` is torch again once the call returns.  The
buffers are slower to copy from, as upstream's own fallback (2026.9.5) makes them.  Revert puts the function back.
docs/fixes/unsloth-zoo-pinned-memory.md.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from hotfix import Mechanism, Patch

MODULE = "unsloth_zoo.gradient_checkpointing"
SETUP = "initialize_unsloth_gradient_checkpointing"
#: the first release whose set-up falls back to pageable memory itself
UPSTREAM_FIX = "2026.9.5"


class PageableWhereRefused:
    """``torch`` for one call of the set-up: ``empty(..., pin_memory=True)`` falls back to pageable memory where
    pinning is refused (``refused(error)`` hears of it); every other attribute is torch's."""

    def __init__(self, torch: Any, refused: Callable[[BaseException], None]) -> None:
        self._torch = torch
        self._refused = refused

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def empty(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("pin_memory"):
            return self._torch.empty(*args, **kwargs)
        try:
            return self._torch.empty(*args, **kwargs)
        except RuntimeError as exc:  # cudaHostAlloc refused ("out of memory"), or no pinned allocator at all
            buffer = self._torch.empty(*args, **{**kwargs, "pin_memory": False})
            self._refused(exc)
            return buffer


def setup_with_pageable_fallback(fix: Patch, module: Any) -> Callable:
    """The wrapt wrapper of the module's set-up function."""

    def refused(exc: BaseException) -> None:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fix.repaired(f"pinned host memory was refused ({first[:120]}); its offload buffers were made in pageable "
                     "memory (slower copies), where unsloth's set-up raised",
                     call="unsloth's offload set-up (initialize_unsloth_gradient_checkpointing)")

    def initialize_with_pageable_fallback(wrapped, instance, args, kwargs):  # named: wrapper chains read it
        real = module.__dict__.get("torch")
        stand_in = PageableWhereRefused(real, refused)
        module.torch = stand_in  # the set-up reads the module's global `torch`: this call only
        try:
            return wrapped(*args, **kwargs)
        finally:
            if module.__dict__.get("torch") is stand_in:
                module.torch = real

    return initialize_with_pageable_fallback


class UnslothZooPinnedMemory(Patch):
    name = "unsloth-zoo-pinned-memory"
    targets = (MODULE,)
    # read in 2024.11.6 (one pinned buffer), 2025.1.1, 2025.11.3, 2026.8.9, 2026.9.4 (200) and 2026.9.5 (fallback)
    mechanisms = (
        Mechanism("pinned-setup", {"unsloth-zoo": f">=2024.11.6,<{UPSTREAM_FIX}"}, fixed_in=UPSTREAM_FIX,
                  summary="unsloth's offload set-up pins its host buffers with no fallback: where page-locked "
                          "memory is refused (WSL2) it raises 'CUDA error: out of memory'"),
        # up to 2026.8.10 hotfix's offload pool (unsloth-zoo-offload-backward) replaces unsloth's forward and falls
        # back itself; after it unsloth's own forward pins the buffers it grows, out of this fix's reach
        Mechanism("pinned-growth", {"unsloth-zoo": f">=2026.8.11,<{UPSTREAM_FIX}"}, fixed_in=UPSTREAM_FIX,
                  unreached={"unsloth-zoo": f">=2026.8.11,<{UPSTREAM_FIX}"},
                  summary="unsloth's offload forward pins the host buffers it grows, with no fallback"),
    )
    symptom = ("RuntimeError: CUDA error: out of memory at unsloth's gradient checkpointing set-up on a nearly empty "
               "GPU (WSL2: pinned host memory refused)")
    upstream = "unslothai/unsloth-zoo#1257, fixed in 2026.9.5"

    def drift(self, module: Any) -> Optional[str]:
        setup = module.__dict__.get(SETUP)
        if not callable(setup):
            return f"{SETUP} is missing"
        if "torch" not in getattr(getattr(setup, "__code__", None), "co_names", ()):
            return f"{SETUP} no longer reads the module's torch"
        return None

    def _apply(self, module: Any) -> None:
        self.wrap(module, SETUP, setup_with_pageable_fallback(self, module))  # its own module: a reload's too


patch = UnslothZooPinnedMemory()
