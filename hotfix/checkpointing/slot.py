"""A class-level stand-in for ``module._gradient_checkpointing_func`` that wraps it on read.

transformers stores the checkpoint function on each checkpointing module and reads it back
at every checkpointed call.  A fix that stored its own wrapper there would put a hotfix
object inside the user's model (deepcopy, pickle, ``torch.save``, EMA copies, spawned
workers would carry it).  A data descriptor on the module's class wins over the instance
``__dict__``, so the model keeps exactly what transformers stored and every read, on the
original or a copy, returns it wrapped.  Slots of several fixes on one class's MRO compose
in a fixed order (by ``rank``, outermost highest), whichever classes hold them; each fix
installs and reverts only its own.  The composition is made once per (module class, stored
function) and kept while the slots standing on the class's MRO are the same objects (a tuple of
the classes' entries, compared at each read) and each fix whose answer for that function may
change (``settled``) answers as before; a non-reentrant stored function (transformers 5.x's default) whose acting
slots act on reentrant calls only is handed out with one layer that routes only a call asking ``use_reentrant=True``
through them.  Under ``torch.compile`` the raw function is handed out:
dynamo traces the checkpoint itself, where the reentrant bugs do not exist.  Dynamo inlines the
slot's ``__get__``; there the function comes from the slot (the one function every module it
answers for holds, recorded as they store it), not from ``instance.__dict__``: torch 2.11's dynamo
answers ``instance.__dict__[name]`` by reading the attribute ``name``, i.e. through this slot again,
without end (RecursionError), and a record per module would make dynamo compile each layer apart.
The slot is a ``property`` (its getter is that compiled read) because dynamo does not inline every
descriptor's ``__get__``: torch <= 2.8 treats any other data descriptor as the value itself (it
called the slot object and failed its own guard check, "Guard check failed: ___check_type_id(
self._gradient_checkpointing_func"), while every torch line 2.4 - 2.15 traces a property's ``fget``.
:class:`SlotCoverage` puts one fix's slot on the classes that hold a checkpoint function, after
transformers' enablers set it (and on unpickling, and for models built before activation).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import wrapt

from hotfix.checkpointing.code import code_objects, keep_dynamo_out_of_hotfix

ATTRIBUTE = "_gradient_checkpointing_func"
SETTER = "_set_gradient_checkpointing"
#: PreTrainedModel methods after which a model's modules may hold a checkpoint function
#: (``__setstate__``: unpickling, deepcopy, torch.load, spawn workers)
ENABLERS = (SETTER, "gradient_checkpointing_enable", "activation_checkpointing_enable", "__setstate__")


def _told_by_identity(pretrained: type, method: str) -> bool:
    """Does transformers tell an override of ``method`` from its own function by identity?  From 5.24
    ``activation_checkpointing_enable`` calls the deprecated ``gradient_checkpointing_enable`` where a model
    overrides it (``PreTrainedModel._is_overridden``: ``__func__ is not``): a wrapper there makes every model look
    overridden, and each call says "gradient_checkpointing_enable is deprecated" for the method the user did not
    call.  Left unwrapped, the alias calls ``activation_checkpointing_enable``, which is wrapped."""
    return (method == "gradient_checkpointing_enable" and hasattr(pretrained, "_is_overridden")
            and hasattr(pretrained, "activation_checkpointing_enable"))


def always(raw: Any) -> bool:
    return True


def never(raw: Any) -> bool:
    return False


def slots_on(cls: type) -> Tuple["CheckpointFunctionSlot", ...]:
    """Every slot along ``cls``'s MRO (with the slots each displaced on its class), innermost (lowest rank) first."""
    found, wrappers = [], set()
    for klass in cls.__mro__:
        slot = klass.__dict__.get(ATTRIBUTE)
        while isinstance(slot, CheckpointFunctionSlot):
            if id(slot.wrapper) not in wrappers:  # one fix's slot on a class and on its base: wrap once
                wrappers.add(id(slot.wrapper))
                found.append(slot)
            slot = slot.displaced
    return tuple(sorted(found, key=lambda s: (s.rank, s.fix)))


class _Composed(NamedTuple):
    """The wrapper a class's reads of ``raw`` hand out, and what it was made from."""

    raw: Any
    # What decides ``slots_on(cls)``: ``entries``, the ``__dict__.get`` of each class of its MRO (bound once: no
    # mappingproxy per class at each read), and ``standing``, what each returned for ``ATTRIBUTE`` then (slots never
    # change their ``displaced`` once made), compared by identity.
    entries: tuple
    standing: tuple
    states: Tuple[Tuple[Callable[[], Any], bool], ...]  # (a slot's ``active``, whether it answered other than None)
    unsettled: Tuple[Tuple["CheckpointFunctionSlot", bool], ...]  # (slot, its serves(raw) then) where it may change
    wrapper: Any


#: the attribute of each wrapt layer of a composed call holding the stored function's mode (reentrant unless a
#: ``partial`` sets ``use_reentrant`` false): a ``_self_`` name, which wrapt keeps on the proxy, not on what it wraps
STORED_MODE = "_self_stored_reentrant"


def non_reentrant(raw: Any) -> bool:
    """Is ``raw`` a stored function whose calls are non-reentrant unless one asks otherwise: a ``partial`` with
    ``use_reentrant`` set and false (``hotfix.checkpointing.inputs.is_reentrant``'s rule: unset is reentrant)?"""
    if not isinstance(raw, functools.partial):
        return False
    value = raw.keywords.get("use_reentrant")
    return value is not None and not value


def reentrant_slots_bypassed(raw: Any, acting: list) -> bool:
    """Does the composed call of ``raw`` leave the ``acting`` slots out (a non-reentrant stored function, every slot
    acting on it acting on reentrant calls only)?  ``_compose`` builds by it; ``explain.what_runs`` says it."""
    return bool(acting) and non_reentrant(raw) and all(slot.reentrant_only for slot in acting)


def through_slots_if_reentrant(composed: Any) -> Callable:
    """The wrapt wrapper around a non-reentrant stored function whose slots act on reentrant calls only: a call is
    the function's own, unless it passes ``use_reentrant=True`` itself; that one goes through ``composed``."""
    def non_reentrant_call(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if kwargs.get("use_reentrant"):
            return composed(*args, **kwargs)
        return wrapped(*args, **kwargs)

    return non_reentrant_call


def _first_slot(cls: type) -> Optional["CheckpointFunctionSlot"]:
    """The slot Python's attribute lookup finds on ``cls`` (the first class of its MRO defining ``ATTRIBUTE``)."""
    for klass in cls.__mro__:
        if ATTRIBUTE in klass.__dict__:
            found = klass.__dict__[ATTRIBUTE]
            return found if isinstance(found, CheckpointFunctionSlot) else None
    return None


def read_under_compile(slot: "CheckpointFunctionSlot", instance: Any) -> Any:
    """What ``instance``'s checkpoint function reads as while dynamo traces: the raw function, not a wrapper."""
    common = slot._common
    if common is not None:
        return common
    # Modules holding different functions (two models with checkpointing enabled, a deep copy, or none
    # recorded: a layer copied on its own, compiled before any eager step) read their own.  Not
    # ``instance.__dict__``: the dynamo of torch < 2.13 answers that by reading the attribute, i.e. this
    # getter again (RecursionError); this read costs it a graph break there instead.
    # Unset reads as None, not AttributeError: a class attribute shows in dir(), and code that
    # getattr()s everything dir() lists (dynamo's graph assembly does) must not fail on it.
    return object.__getattribute__(instance, "__dict__").get(ATTRIBUTE)


class CheckpointFunctionSlot(property):
    """Data descriptor for ``ATTRIBUTE`` on ``owner``: reads return the stored function wrapped.

    A ``property`` only so that dynamo traces its ``fget`` (the read under compile); Python's own
    lookup runs the ``__get__``/``__set__``/``__delete__`` below.
    """

    def __init__(self, owner: type, wrapper: Callable, is_compiling: Callable[[], bool], rank: int,
                 displaced: Optional["CheckpointFunctionSlot"] = None,
                 serves: Callable[[Any], bool] = always, settled: Optional[Callable[[Any], bool]] = None,
                 fix: str = "", active: Optional[Callable[[], Any]] = None, reentrant_only: bool = False) -> None:
        slot = self
        super().__init__(lambda instance: read_under_compile(slot, instance))
        keep_dynamo_out_of_hotfix()  # torch is imported: the modules this slot serves are torch modules
        self.owner = owner
        self.fix = fix  # the name of the fix whose slot this is (what a developer reads: hotfix.checkpointing.explain)
        self.wrapper = wrapper  # a wrapt wrapper function (wrapped, instance, args, kwargs)
        self.rank = rank
        # Does its fix act on calls through this stored function?  (Not where it relies on a fix that is not
        # applied there: ``CheckpointFunctionFix.serves``.)  Asked when the composition is made, and again at each
        # read where ``settled(raw)`` is False (its answer for that function may change with what is applied).
        self.serves = serves
        self.settled = settled or (always if serves is always else never)  # an answer of unknown kind: asked each read
        # Where its fix acts only in some state of the process (inside a DDP forward): a callable without arguments
        # that returns None outside it, asked at each read (a C callable costs the read no Python frame)
        self.active = active
        # Its fix acts on reentrant calls only (hands every non-reentrant call on as it is): out of the composed call
        # of a non-reentrant stored function (``_compose``)
        self.reentrant_only = reentrant_only
        # Another fix's slot that stood on ``owner`` first: it keeps working through this one, and comes
        # back when this fix reverts (fixes revert in the reverse order of application).
        self.displaced = displaced
        self._is_compiling = is_compiling
        # module class -> its composition: every module of a model holds the same function object, so one entry
        # per class serves them all (a class with no slot of its own is answered by a base class's slot).
        self._composed: Dict[type, _Composed] = {}
        # module -> the function in its __dict__ (filled where a function is stored through this slot, by
        # SlotCoverage.cover for functions stored before the slot stood there, and by reads outside
        # compile), and the one function they all hold: what a read under torch.compile hands out (see the
        # module docstring); None where they differ or none is known.  Not ``self`` for that: torch 2.7's
        # dynamo reads an attribute holding a property by calling the property's getter (this read again).
        self._held: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
        self._common: Any = None

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self
        if self._is_compiling():
            # Not self.fget(): the dynamo of torch 2.5 inlines this __get__ for some modules, and cannot read a
            # property's fget there (AttributeError: a graph break, then hotfix's wrapper runs in eager code)
            return read_under_compile(self, instance)
        raw = instance.__dict__.get(ATTRIBUTE)
        if raw is None:
            return raw
        if self._held.get(instance, self) is not raw:  # hold()'s own first question, without its frame each read
            self.hold(instance, raw)
        cls = type(instance)
        composed = self._composed.get(cls)
        # every checkpointed call reads this: loops written out, no comprehension or generator frame
        # (tools/hotfix_lab/bench/wrapper_cost.py)
        if composed is None or composed.raw is not raw:
            return self._compose(cls, raw).wrapper
        for entry, standing in zip(composed.entries, composed.standing):
            if entry(ATTRIBUTE) is not standing:
                return self._compose(cls, raw).wrapper
        for active, was in composed.states:
            if (active() is not None) is not was:
                return self._compose(cls, raw).wrapper
        for slot, served in composed.unsettled:
            if slot.serves(raw) is not served:
                return self._compose(cls, raw).wrapper
        return composed.wrapper

    def acts_on(self, raw: Any) -> bool:
        """Does this slot's fix act on calls through ``raw`` now (it serves ``raw``, in the state it acts in)?"""
        return bool(self.serves(raw)) and (self.active is None or self.active() is not None)

    def _compose(self, cls: type, raw: Any) -> _Composed:
        acting, states, unsettled = [], [], []
        for slot in slots_on(cls):
            serves = bool(slot.serves(raw))
            if not slot.settled(raw):
                unsettled.append((slot, serves))
            now = True
            if slot.active is not None:
                now = slot.active() is not None
                states.append((slot.active, now))
            if serves and now:
                acting.append(slot)
        wrapper = raw
        reentrant = not non_reentrant(raw)
        for slot in acting:
            wrapper = wrapt.FunctionWrapper(wrapper, slot.wrapper)
            # the stored function's mode, decided here once and handed to every layer further out
            # (``inputs.is_reentrant``): no slot's wrapper steps through the others' layers to read it
            setattr(wrapper, STORED_MODE, reentrant)
        if reentrant_slots_bypassed(raw, acting):
            # transformers 5.x's default, TRL's kwargs: the stored function as it is, unless a call asks for
            # reentrant checkpointing itself (tools/hotfix_lab/bench/wrapper_cost.py: the slots' layers cost such a call ~5 µs)
            wrapper = wrapt.FunctionWrapper(raw, through_slots_if_reentrant(wrapper))
        entries = tuple(klass.__dict__.get for klass in cls.__mro__)
        composed = _Composed(raw, entries, tuple(entry(ATTRIBUTE) for entry in entries), tuple(states),
                             tuple(unsettled), wrapper)
        self._composed[cls] = composed
        return composed

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[ATTRIBUTE] = value
        self.hold(instance, value)

    def __delete__(self, instance: Any) -> None:
        try:
            del instance.__dict__[ATTRIBUTE]
        except KeyError:
            raise AttributeError(ATTRIBUTE) from None
        self._held.pop(instance, None)
        if not self._held:
            self._common = None
        elif self._common is None:  # those left may agree now
            self._settle()

    def hold(self, instance: Any, raw: Any) -> None:
        """Record ``raw`` as what ``instance`` holds (read back under torch.compile)."""
        try:
            previous = self._held.get(instance, self)
            if previous is raw:
                return
            self._held[instance] = raw
        except TypeError:  # a module class that is not hashable: compiled reads fall back to __dict__
            self._common = None
            return
        if raw is self._common and previous is self:  # one more module holding the common function: it stays common
            return
        if len(self._held) == 1:  # the one module held (torch-checkpoint-wrapper's routed layer, during its call)
            self._common = raw
            return
        self._settle()  # another function, or a module's changed: every module held is looked at

    def _settle(self) -> None:
        try:
            functions = {id(raw): raw for raw in self._held.values()}
        except RuntimeError:  # another thread changed the record meanwhile: compiled reads fall back to __dict__
            functions = {}
        self._common = next(iter(functions.values())) if len(functions) == 1 else None


def setter_drift(module: Any) -> Optional[str]:
    """Why ``transformers.modeling_utils`` no longer stores checkpoint functions where the slots read them."""
    setter = getattr(getattr(module, "PreTrainedModel", None), SETTER, None)
    if setter is None:
        return f"PreTrainedModel.{SETTER} is missing"
    if not any(ATTRIBUTE in code.co_names for code in code_objects(setter)):
        return f"PreTrainedModel.{SETTER} no longer stores the checkpoint function as {ATTRIBUTE}"
    return None


class SlotCoverage:
    """One fix's slot on the class of every module that holds a checkpoint function.

    ``patch`` installs through its own ``wrap``/``replace`` (so its revert takes everything back);
    a class whose MRO already carries this fix's slot (a ``GradientCheckpointingLayer`` subclass,
    a subclass of a covered class) is left alone: the slot there serves it.
    """

    def __init__(self, patch: Any, wrapper: Callable, rank: int,
                 serves: Callable[[Any], bool] = always, settled: Optional[Callable[[Any], bool]] = None,
                 active: Optional[Callable[[], Any]] = None, reentrant_only: bool = False) -> None:
        self.patch, self.wrapper, self.rank, self.serves, self.settled = patch, wrapper, rank, serves, settled
        self.active, self.reentrant_only = active, reentrant_only

    def hook(self, modeling_utils: Any) -> None:
        """Cover after every enabler of ``PreTrainedModel``, and the models that exist already."""
        pretrained = modeling_utils.PreTrainedModel
        for method in ENABLERS:
            if hasattr(pretrained, method) and not _told_by_identity(pretrained, method):
                self.patch.wrap(pretrained, method, self._cover_after)
        # Model classes from other modules exist (modeling_utils defines one base of its own): models
        # may have been set up before activation.  On the start-up hook's path none exist yet.
        if any(cls.__module__ != modeling_utils.__name__ for cls in pretrained.__subclasses__()):
            import gc

            for obj in gc.get_objects():
                # type(), not isinstance(): isinstance reads obj.__class__, a property on some objects
                # (torch.distributed.reduce_op warns when read).
                if issubclass(type(obj), pretrained):
                    self.cover(obj)

    def _cover_after(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        """wrapt wrapper of the enablers and ``__setstate__``: cover the model they just set up."""
        result = wrapped(*args, **kwargs)
        if instance is not None and self.patch.applied:
            self.cover(instance)
        return result

    def cover(self, model: Any) -> None:
        """Install the slot on the class of every module of ``model`` that holds a checkpoint function."""
        holders = [module for module in model.modules() if ATTRIBUTE in module.__dict__]
        classes = {type(module) for module in holders}
        self._install(classes)
        # What each module held before a slot stood on its class (or before it was unpickled), recorded
        # by the slot that now answers its reads.
        for module in holders:
            slot = _first_slot(type(module))
            if slot is not None:
                slot.hold(module, module.__dict__[ATTRIBUTE])

    def cover_class(self, cls: type) -> None:
        """Install the slot on the layer class ``cls``, where this fix's slot does not stand along its MRO yet: for
        layers that are the one holder of their call's function (torch-checkpoint-wrapper's routed calls: one look
        along the MRO, not a walk over the layer's modules)."""
        for klass in cls.__mro__:
            slot = klass.__dict__.get(ATTRIBUTE)
            while isinstance(slot, CheckpointFunctionSlot):
                if slot.wrapper is self.wrapper:
                    return
                slot = slot.displaced
        self._install({cls})

    def _install(self, classes: set) -> None:
        with self.patch._lock:
            for cls in classes:
                if any(slot.wrapper is self.wrapper for slot in slots_on(cls)):
                    continue
                present = cls.__dict__.get(ATTRIBUTE)
                if present is not None and not isinstance(present, CheckpointFunctionSlot):
                    self.patch.warn_once(cls, f"{cls.__qualname__} defines {ATTRIBUTE} itself; not covered")
                    continue
                self.patch.replace(cls, ATTRIBUTE, self.slot(cls, displaced=present))

    def slot(self, cls: type, displaced: Optional[CheckpointFunctionSlot] = None) -> CheckpointFunctionSlot:
        """This fix's slot for ``cls`` (torch is imported: the classes it serves are torch modules)."""
        from torch.compiler import is_compiling

        return CheckpointFunctionSlot(cls, self.wrapper, is_compiling, rank=self.rank, displaced=displaced,
                                      serves=self.serves, settled=self.settled, fix=self.patch.name, active=self.active,
                                      reentrant_only=self.reentrant_only)
