"""A transformers layer checkpointed by torch's ``checkpoint_wrapper``, handed to transformers' own checkpointing.

FSDP / FSDP2 recipes (accelerate's ``fsdp_activation_checkpointing``, Lightning's FSDP strategy, torchtitan's
``apply_activation_checkpointing``) wrap each layer in torch's ``CheckpointWrapper``, whose forward calls
``checkpoint_fn(layer, *args, **kwargs)``.  transformers then does not know that the layer is checkpointed: it
hands the layer its Cache, and the recomputation writes the Cache a second time (reentrant: gradients silently
wrong; non-reentrant: "Recomputed values ... have different metadata").  Under its own checkpointing a
``GradientCheckpointingLayer`` in training gets no Cache (each release's own rule: ``use_cache=False``,
``past_key_values=None``; the model still builds its Cache, which stays empty: nothing reads it in a training
step).  :class:`CheckpointedByTransformers` runs the layer that way for one call, with the wrapper's own
checkpoint function, so that every fix on transformers' checkpoint function acts on it as on any other layer.

Where the wrapper packs keyword arguments into positional inputs (``CheckpointImpl.REENTRANT``), a tensor
passed by keyword is a checkpoint input upstream too: the function handed over is a :class:`PackedKeywords`,
which the keyword-tensor fix reads so that it never claims a repair the wrapper had made itself.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any, List, Tuple

from hotfix import relations
from hotfix.checkpointing.slot import ATTRIBUTE

__all__ = ["CLASS_NAME", "CheckpointedByTransformers", "PackedKeywords", "RoutePlans", "StoredFunctions",
           "hands_a_cache", "missing", "packed_upstream", "routed_fixes", "transformers_layer", "without_cache"]

#: torch's module and class (``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.CheckpointWrapper``)
CLASS_NAME = "CheckpointWrapper"
#: the keyword names under which transformers' layers receive a Cache (it drops them under its checkpointing); any
#: ``transformers.cache_utils.Cache`` instance, by another name or positional, is one too (``_is_cache``)
CACHE_KEYWORDS = ("past_key_value", "past_key_values", "layer_past")
#: what says whether a layer is checkpointed (transformers' ``GradientCheckpointingLayer``)
FLAG = "gradient_checkpointing"


class PackedKeywords(functools.partial):
    """The wrapper's checkpoint function where the wrapper itself makes keyword tensors checkpoint inputs."""


class StoredFunctions:
    """The function a routed call stores on its layer: one object for every wrapper of the same setting.

    Each ``CheckpointWrapper`` makes its own ``partial`` of torch's checkpoint (and the REENTRANT route a
    :class:`PackedKeywords` of it at each call): stored as they are, every layer of a model would hold another
    object, and the slots would compose the call again at each one (their composition is kept per stored function)
    and look over every module they record.  Equal settings (the same function, arguments and keywords) share one
    object; a setting that cannot be told equal (an unhashable argument) is stored as made.
    """

    def __init__(self) -> None:
        self._made: dict = {}
        # each wrapper's own function -> (reentrant, what it is stored as): asked at every routed call, answered
        # without building the setting's key again
        self._seen: "weakref.WeakKeyDictionary[Any, Tuple[bool, Any]]" = weakref.WeakKeyDictionary()

    def of(self, function: Any, reentrant: bool) -> Any:
        try:
            seen = self._seen.get(function)
        except TypeError:  # not weakly referable or not hashable: as made
            seen = None
        if seen is not None and seen[0] is reentrant:
            return seen[1]
        made = self._shared(function, reentrant)
        try:
            self._seen[function] = (reentrant, made)
        except TypeError:
            pass
        return made

    def _shared(self, function: Any, reentrant: bool) -> Any:
        if not isinstance(function, functools.partial):
            return function
        try:
            key = (type(function), function.func, function.args, tuple(sorted(function.keywords.items())), reentrant)
            made = self._made.get(key)
        except TypeError:  # an argument that cannot be hashed: no setting to share
            return self._made_of(function, reentrant)
        if made is None:
            made = self._made[key] = self._made_of(function, reentrant)
        return made

    @staticmethod
    def _made_of(function: functools.partial, reentrant: bool) -> Any:
        return PackedKeywords(function.func, *function.args, **function.keywords) if reentrant else function


def packed_upstream(checkpoint: Any, call: Any) -> frozenset:
    """The ids of the tensors ``call`` (the layer's partial) binds by keyword that the wrapper would itself have
    passed as checkpoint inputs: those of a call through a :class:`PackedKeywords`, else none."""
    if not isinstance(checkpoint, PackedKeywords):
        return frozenset()
    from hotfix.checkpointing.layer_call import layer_call  # imports torch: only for a call from the wrapper
    from hotfix.checkpointing.structure import is_tensor

    call = layer_call(call)
    keywords = call.keywords if isinstance(call, functools.partial) else {}
    return frozenset(id(value) for value in keywords.values() if is_tensor(value))


def transformers_layer(module: Any) -> bool:
    """Is ``module`` a transformers ``GradientCheckpointingLayer`` (4.52+)?  Read from the imported module only."""
    layers = sys.modules.get("transformers.modeling_layers")
    layer_class = getattr(layers, "GradientCheckpointingLayer", None)
    return isinstance(layer_class, type) and isinstance(module, layer_class)


def _is_cache(value: Any) -> bool:
    """Is ``value`` a transformers Cache, whatever the name or place it is handed under (GPT-2's block takes it
    positionally; 5.24's layers by ``cache=``)?  Read from the imported module only."""
    cache_class = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    return isinstance(cache_class, type) and isinstance(value, cache_class)


def _is_cache_argument(name: str, value: Any) -> bool:
    return value is not None and (name in CACHE_KEYWORDS or _is_cache(value))


def hands_a_cache(layer: Any, args: tuple, kwargs: dict) -> bool:
    """Does this call hand ``layer`` a Cache that its recomputation would write again?

    5.x layers that only read the Cache say so (``_can_checkpoint_with_cache``): transformers keeps it for them.
    Asked at every routed call: the Cache class looked up once per call, not per argument.
    """
    if getattr(layer, "_can_checkpoint_with_cache", False):
        return False
    cache_class = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    if not isinstance(cache_class, type):
        cache_class = ()  # isinstance(x, ()) is False: only the keyword names tell
    for value in args:
        if isinstance(value, cache_class):
            return True
    for name, value in kwargs.items():
        if value is not None and (name in CACHE_KEYWORDS or isinstance(value, cache_class)):
            return True
    return False


def without_cache(args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """``args`` and ``kwargs`` with no Cache and ``use_cache`` off, as transformers' checkpointing hands a layer in
    training (4.53+ does it in the layer, GPT-2's model passes None in the Cache's place; 4.52's layer leaves it to
    the model's forward, which does not know of the wrapper)."""
    args = tuple(None if _is_cache(value) else value for value in args)
    kept = {name: (None if _is_cache_argument(name, value) else value) for name, value in kwargs.items()}
    if kept.get("use_cache"):
        kept["use_cache"] = False
    return args, kept


class CheckpointedByTransformers:
    """For the calls inside ``with CheckpointedByTransformers(layer, function):``, ``layer`` is checkpointed by
    transformers with ``function``; as it was afterwards.

    The recomputation runs what the layer handed ``function`` (its partial): it reads neither attribute again,
    so restoring them once the call returns is safe for a backward that comes later.  A class, not a generator
    context manager: entered at every routed call (a generator's frame and its ``contextlib`` wrapper cost more).
    """

    __slots__ = ("layer", "function", "_had_flag", "_flag")

    def __init__(self, layer: Any, function: Any) -> None:
        self.layer, self.function = layer, function

    def __enter__(self) -> None:
        state = self.layer.__dict__
        self._had_flag, self._flag = FLAG in state, state.get(FLAG)
        state[FLAG] = True
        # through a slot where one stands on its class (it records the function); object's, not Module.__setattr__'s
        # look through the layer's parameters, buffers and modules: the name is none of them
        object.__setattr__(self.layer, ATTRIBUTE, self.function)

    def __exit__(self, *exc: Any) -> None:
        object.__delattr__(self.layer, ATTRIBUTE)
        state = self.layer.__dict__
        if self._had_flag:
            state[FLAG] = self._flag
        else:
            del state[FLAG]


def missing(fix: Any) -> List[str]:
    """The fixes ``fix`` relies on for every call it routes (``relations.ALWAYS``) that are not applied here: without
    them it leaves the wrapper's call as upstream makes it."""
    return [other.name for other in fix.relied_on(relations.ALWAYS) if not other.applied]


def routed_fixes(fix: Any) -> Tuple[Any, ...]:
    """The applied fixes on transformers' checkpoint function that act on a call ``fix`` routes to it
    (``relations.ALWAYS`` and ``relations.ROUTED``): their slots go on the layer's class."""
    return tuple(other for other in fix.relied_on(relations.ALWAYS) + fix.relied_on(relations.ROUTED) if other.applied)


class RoutePlans:
    """What ``fix``'s routed calls of a layer class need, decided once per class, not at every call: the fixes it
    relies on that are missing (then it leaves the call as upstream makes it) and, where none is, the routed fixes'
    slots put on the class.  Decided again where a relied fix was applied or reverted since, or what stands along the
    class's MRO changed (a slot put or taken away).  Asking at each call whether every relied fix was applied and
    looking for each one's slot along the MRO cost 4 - 6 µs a routed call (tools/hotfix_lab/bench/wrapper_site_cost.py)."""

    def __init__(self, fix: Any) -> None:
        self._fix = fix
        # layer class -> (missing, the relied fixes' applied states, the MRO's ``__dict__.get``s, what they answered)
        self._plans: "weakref.WeakKeyDictionary[type, tuple]" = weakref.WeakKeyDictionary()

    def missing(self, cls: type) -> List[str]:
        """The fixes missing for a routed call of a ``cls`` layer (none: the class's slots stand)."""
        relied = self._fix.relied_on(relations.ALWAYS) + self._fix.relied_on(relations.ROUTED)
        states = tuple(other.applied for other in relied)
        plan = self._plans.get(cls)
        if plan is not None and plan[1] == states:
            for entry, standing in zip(plan[2], plan[3]):
                if entry(ATTRIBUTE) is not standing:
                    break
            else:
                return plan[0]
        found = missing(self._fix)
        if not found:
            for slot_fix in routed_fixes(self._fix):
                slot_fix.coverage.cover_class(cls)
        entries = tuple(klass.__dict__.get for klass in cls.__mro__)
        self._plans[cls] = (found, states, entries, tuple(entry(ATTRIBUTE) for entry in entries))
        return found
