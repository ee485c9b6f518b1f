"""The base of the fixes that act on the checkpoint function transformers stores on modules.

Such a fix writes one thing: ``build_wrapper`` (``Patch``'s, as every fix that wraps something), the wrapt
wrapper its slots put around the stored function (built at the fix's first apply: its target has imported
torch by then; loading the fix imports none).  The base owns the rest, once for all of them: the slot coverage
(``hotfix.checkpointing.slot.SlotCoverage``) hooked on ``transformers.modeling_utils``, the drift check
of transformers' setter, the slot's rank (``hotfix.relations.SLOT_ORDER``), and where the fix steps
aside because a fix it relies on is not applied (:meth:`serves`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional

from hotfix import relations
from hotfix.declarations import Mechanism
from hotfix.patch import Patch
from hotfix.checkpointing.slot import SlotCoverage, setter_drift

#: where transformers' setter stores checkpoint functions on a model's modules
MODELING_UTILS = "transformers.modeling_utils"
#: the releases transformers' fixes reach: 4.35.0 introduced ``_set_gradient_checkpointing(enable,
#: gradient_checkpointing_func)``, the hook; before it each model called torch's checkpoint from its own code, with
#: the same defects out of their reach (``Mechanism.unreached``: NOT COVERED there, never "not needed")
REACHED = {"transformers": ">=4.35.0"}
NOT_REACHED = {"transformers": "<4.35.0"}


def on_every_reached_release(name: str, summary: str) -> Mechanism:
    """A transformers mechanism every release the fixes reach has (and every one before may have: NOT COVERED)."""
    return Mechanism(name, REACHED, unreached=NOT_REACHED, summary=summary)


def _function_of(raw: Any) -> Any:
    return raw.func if isinstance(raw, functools.partial) else raw


class CheckpointFunctionFix(Patch):
    """A fix whose slots wrap ``module._gradient_checkpointing_func`` (``targets`` include ``MODELING_UTILS``)."""

    targets = (MODELING_UTILS,)
    #: True where the fix acts on reentrant calls only (it hands every non-reentrant call on as it is): its slot is
    #: then out of the composed call of a stored function that is non-reentrant (``slot.non_reentrant``)
    reentrant_only = False

    def __init__(self) -> None:
        super().__init__()
        self._coverage: Optional[SlotCoverage] = None

    @property
    def coverage(self) -> SlotCoverage:
        """This fix's slot coverage, made with its wrapper at the first apply."""
        if self._coverage is None:
            self._coverage = SlotCoverage(self, self.wrapper, relations.slot_rank(self.name), self.serves,
                                          self.settled, self.acting_while(), self.reentrant_only)
        return self._coverage

    def acting_while(self) -> Optional[Callable[[], Any]]:
        """Where this fix acts only in some state of the process: a callable without arguments returning None
        outside it (its slot then stays out of the composed call), asked at every read of the checkpoint function,
        so cheap (a C callable where possible).  None: it acts in any state.  Asked once, at the first apply."""
        return None

    def serves(self, raw: Any) -> bool:
        """Does this fix act on calls through the stored function ``raw``?

        Not where ``raw`` (or the function of a ``partial``) is a checkpoint function of a fork whose fix this
        one relies on (``relations.FORK_CHECKPOINT``) and that fix has not put in place: axolotl's own wrapper
        reads the call transformers made (``decoder_layer.func``), which this fix's rewrite of the call is not.
        """
        function = _function_of(raw)
        module = getattr(function, "__module__", None)
        return not any(module in fork.targets and not fork.installed(function)
                       for fork in self.relied_on(relations.FORK_CHECKPOINT))

    def settled(self, raw: Any) -> bool:
        """Is :meth:`serves`'s answer for ``raw`` the same whatever is applied later?  Yes unless ``raw``'s
        function comes from a fork this fix relies on there (a fork's targets are declared, never changed)."""
        module = getattr(_function_of(raw), "__module__", None)
        return not any(module in fork.targets for fork in self.relied_on(relations.FORK_CHECKPOINT))

    def missing(self, under_ddp: bool = False) -> List[str]:
        """The fixes this one relies on for every call it changes (``relations.ALWAYS``), and ``under_ddp`` for a
        call inside a searching DDP forward (``relations.UNDER_DDP``), that are not applied here."""
        relied = self.relied_on(relations.ALWAYS) + (self.relied_on(relations.UNDER_DDP) if under_ddp else ())
        return [fix.name for fix in relied if not fix.applied]

    def drift(self, module: Any) -> Optional[str]:
        return setter_drift(module) if module.__name__ == MODELING_UTILS else None

    def _apply(self, module: Any) -> None:
        if module.__name__ == MODELING_UTILS:
            self.coverage.hook(module)
