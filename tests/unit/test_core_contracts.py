"""In-process unit tests of the core contracts: seconds, no child interpreter, no release matrix.

Run alone with ``pytest -m unit`` (after ``pip install -e .`` in a checkout) or inside the full suite.
"""

from __future__ import annotations

import collections
import copy
import functools
import importlib
import inspect
import logging
import pickle
import sys
import types
from unittest import mock

import pytest
import torch
import wrapt

from hotfix.checkpointing.inputs import find_grad_tensors, hides_nothing, lift_closure_tensors
from hotfix.checkpointing.shared_state import SharedStateWrites
from hotfix.checkpointing.slot import ATTRIBUTE, CheckpointFunctionSlot, SlotCoverage
from hotfix.config import parse_disable, parse_log_level, parse_patch_list
from hotfix.patch import Mechanism, Patch
from hotfix.startup.reload_watch import ReloadWatcher

Pair = collections.namedtuple("Pair", "first second")


class Record(dict):
    """A dict subclass, like transformers' ModelOutput."""


# --------------------------------------------------------------------------- lifting
def _layer(hidden, *, context, extra=None):
    out = hidden * context["scale"] + context["pair"].second
    return out + (extra if extra is not None else 0)


def test_lift_moves_closure_tensors_to_inputs_and_rebuilds_containers():
    scale = torch.randn(3, requires_grad=True)
    second = torch.randn(3, requires_grad=True)
    hidden = torch.randn(3, requires_grad=True)
    context = Record(scale=scale, pair=Pair(torch.zeros(3), second))
    function = functools.partial(_layer, context=context)
    lifted = lift_closure_tensors(function, (hidden,))
    assert lifted is not None
    new_function, inputs = lifted
    assert inputs[0] is hidden and {id(t) for t in inputs[1:]} == {id(scale), id(second)}
    seen = {}

    def spy(hidden, *, context, extra=None):
        seen["types"] = (type(context), type(context["pair"]))
        return _layer(hidden, context=context, extra=extra)

    spy_function, spy_inputs = lift_closure_tensors(functools.partial(spy, context=context), (hidden,))
    twins = [t.detach().requires_grad_() for t in spy_inputs]
    torch.testing.assert_close(spy_function(*twins), _layer(hidden, context=context))
    assert seen["types"] == (Record, Pair)  # named tuple and dict subclass keep their class


def test_lift_returns_none_when_nothing_needs_grad_or_no_partial():
    hidden = torch.randn(3, requires_grad=True)
    assert lift_closure_tensors(functools.partial(_layer, context={"scale": torch.ones(3),
                                                                  "pair": Pair(0, torch.ones(3))}), (hidden,)) is None
    assert lift_closure_tensors(lambda h: h, (hidden,)) is None


def test_lift_does_not_duplicate_a_tensor_that_is_also_positional():
    hidden = torch.randn(3, requires_grad=True)
    function, inputs = lift_closure_tensors(functools.partial(_layer, context={"scale": hidden, "pair": Pair(0, hidden)}),
                                            (hidden,))
    assert len(inputs) == 1 and inputs[0] is hidden


def test_positional_container_tensors_are_lifted():
    a, b = torch.randn(2, requires_grad=True), torch.randn(2, requires_grad=True)
    function, inputs = lift_closure_tensors(functools.partial(lambda pair: pair[0] * pair[1]), ([a, b],))
    assert [id(t) for t in inputs[1:]] == [id(a), id(b)]
    twin_a, twin_b = torch.ones(2), torch.full((2,), 2.0)
    torch.testing.assert_close(function([a, b], twin_a, twin_b), torch.full((2,), 2.0))


def test_find_grad_tensors_collects_each_tensor_once():
    t = torch.randn(1, requires_grad=True)
    found = []
    find_grad_tensors({"x": (t, [t, torch.zeros(1)])}, found, set())
    assert found == [t]


def test_hides_nothing_answers_the_common_call_and_never_skips_what_the_slow_path_would_do():
    """The wrapper's fast path: a call whose partial binds only tensors not needing grad, None, scalars
    (or plain tuples of them: Llama's position_embeddings) and whose inputs are tensors hides nothing.
    Each way something can hide makes it look closer, and wherever it says "nothing", neither the
    lift nor the shared-state watcher would have changed the call."""
    hidden, needs = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    cos, sin = torch.ones(3), torch.zeros(3)

    def layer(h, *args, **kwargs):
        return h

    plain = [functools.partial(layer, position_embeddings=(cos, sin), attention_mask=None, use_cache=False,
                               cache_position=torch.arange(3)), functools.partial(layer, cos), lambda h: h]
    hiding = [functools.partial(layer, encoder_hidden_states=needs),
              functools.partial(layer, pair=(cos, needs)),
              functools.partial(layer, pair=[[needs]]),
              functools.partial(layer, shared={}),
              functools.partial(layer, shared=collections.UserDict()),
              functools.partial(layer, cache=object()),
              functools.partial(layer, Pair(cos, sin))]  # a named tuple: looked at closely
    for function in plain:
        assert hides_nothing(function, (hidden, None, 1)), function
        assert lift_closure_tensors(function, (hidden,)) is None
        assert SharedStateWrites.around(function, (hidden,)) is None
    for function in hiding:
        assert not hides_nothing(function, (hidden,)), function
    assert not hides_nothing(plain[0], ([needs],))  # a container handed positionally
    assert not hides_nothing(plain[0], ({"k": cos},))


# --------------------------------------------------------------------------- the Patch contract
class Owner:
    def method(self):
        return 1


class Fix(Patch):
    name = "unit-fix"
    targets = ("unit_target",)

    def __init__(self, fail_after_first=False, shape_ok=True):
        super().__init__()
        self.fail_after_first, self.shape_ok = fail_after_first, shape_ok

    def drift(self, module):
        return None if self.shape_ok else "Owner is gone"

    def _apply(self, module):
        self.wrap(module.Owner, "method", lambda wrapped, instance, args, kwargs: wrapped() + 10)
        if self.fail_after_first:
            raise RuntimeError("half-way")
        self.replace(module, "added", True)


@pytest.fixture
def target():
    module = types.ModuleType("unit_target")
    module.Owner = type("Owner", (Owner,), {"method": Owner.method})
    return module


def test_apply_revert_is_identity_and_never_stacks(target):
    original = target.Owner.__dict__["method"]
    fix = Fix()
    assert fix.apply(target) and fix.apply(target)  # second call: already applied
    assert target.Owner().method() == 11 and target.added is True
    assert fix.revert()
    assert target.Owner.__dict__["method"] is original and not hasattr(target, "added")
    assert not fix.revert()  # nothing left to undo


def test_failing_apply_rolls_back_what_it_changed(target, caplog):
    original = target.Owner.__dict__["method"]
    fix = Fix(fail_after_first=True)
    with caplog.at_level(logging.WARNING, logger="hotfix"):
        assert fix.apply(target) is False
    assert target.Owner.__dict__["method"] is original
    assert "half-way" in fix.last_error and len(caplog.records) == 1


def test_drift_skips_with_one_line(target, caplog):
    fix = Fix(shape_ok=False)
    with caplog.at_level(logging.WARNING, logger="hotfix"):
        assert fix.apply(target) is False
    assert [r.getMessage() for r in caplog.records] == [
        "hotfix: patch unit-fix skipped: unit_target doesn't match: Owner is gone"]


def test_a_fix_applied_to_one_target_and_skipped_on_another_says_both(target):
    """A fix of two targets (torch-ddp-find-unused: torch's checkpoint module and unsloth-zoo's) applied to one whose
    other target drifted: ``hotfix status`` says where it is applied and what it skipped, not only "APPLIED"."""
    from hotfix.status import state

    class TwoTargets(Fix):
        targets = ("unit_target", "unit_other")

        def drift(self, module):
            return "Owner is gone" if module.__name__ == "unit_other" else None

    fix = TwoTargets()
    assert fix.apply(target)
    assert state(fix, False, True, {}) == "APPLIED to unit_target"
    assert fix.apply(types.ModuleType("unit_other")) is False
    assert state(fix, False, True, {}) == "APPLIED to unit_target; skipped, target changed: Owner is gone"
    fix.revert()


def test_a_release_older_than_the_fix_reaches_is_not_covered_never_not_needed():
    """Outside every mechanism's range, a fix whose mechanism declares the installed release ``unreached``
    says NOT COVERED in ``hotfix status`` (the bug may be there, unrepaired); one without says not needed;
    inside a range nothing is uncovered.  (wrapt stands for the target: installed everywhere hotfix is.)"""
    from hotfix.status import state
    from hotfix.patch import Mechanism
    from hotfix.versions import reader

    wrapt_version = reader.evidence("wrapt").version

    class Older(Patch):
        name = "unit-older"
        mechanisms = (Mechanism("m-old", {"wrapt": ">=999"}, unreached={"wrapt": "<999"}),
                      Mechanism("m-new", {"wrapt": ">=1000"}))

    class Inside(Patch):
        name = "unit-inside"
        mechanisms = (Mechanism("m-here", {"wrapt": ">=1"}), Mechanism("m-old", {"wrapt": ">=999"},
                                                                     unreached={"wrapt": "<999"}))

    older = Older()
    assert older.uncovered_here() == (f"wrapt {wrapt_version} is outside what this fix reaches (wrapt >=999): "
                                      "m-old may be broken here, unrepaired")
    assert state(older, False, True, {}) == "NOT COVERED here: " + older.uncovered_here()
    assert Older.mechanisms[1].unreached == {}  # the default: below the range means not needed
    older.mechanisms = Older.mechanisms[1:]
    assert older.uncovered_here() is None and state(older, False, True, {}) == "not needed here"
    assert Inside().check().applies and Inside().uncovered_here() is None


class _Unreadable(Patch):
    """Would apply here (wrapt is installed everywhere hotfix is) but for the one range that does not parse."""

    name = "unit-unreadable"
    targets = ("unit_target",)

    def _apply(self, module):
        self.replace(module, "added", True)


UNREADABLE = {
    "a mechanism's affected": dict(mechanisms=(Mechanism("bar-keyword", {"wrapt": ">=4.x,<<5"}),)),
    "affected, no mechanisms": dict(affected={"wrapt": ">=4.x,<<5"}),
    "unreached": dict(mechanisms=(Mechanism("bar-keyword", {"wrapt": ">=1"}, unreached={"wrapt": ">=4.x,<<5"}),)),
    "a Mechanism not in a tuple": dict(mechanisms=Mechanism("bar-keyword", {"wrapt": ">=1"})),
}


@pytest.mark.parametrize("declared", UNREADABLE, ids=list(UNREADABLE))
def test_an_unreadable_declaration_is_one_warning_at_load_never_applied_and_never_not_needed(declared, target,
                                                                                            caplog):
    """Issue 31 item 9: a malformed specifier read as "outside the range": never applied, no line, and
    ``hotfix status`` said "not needed here".  Now: one warning when the fix object is created (its module is
    loaded) naming the fix, the mechanism, the distribution and the specifier; never applied; status says why."""
    from hotfix.cli import describe_fix
    from hotfix.status import state

    with caplog.at_level(logging.WARNING, logger="hotfix"):
        fix = type("Unreadable", (_Unreadable,), UNREADABLE[declared])()
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and said[0].startswith("hotfix: unit-unreadable: invalid declaration: "), said
        if declared != "a Mechanism not in a tuple":
            assert "'>=4.x,<<5'" in said[0] and "wrapt" in said[0], said
        if declared != "affected, no mechanisms":
            assert "bar-keyword" in said[0], said
        verdict = fix.check()
        assert not verdict.applies and verdict.reason.startswith("invalid declaration: "), verdict
        assert fix.apply(target) is False and not hasattr(target, "added")
        said_state = state(fix, False, True, {})
        assert said_state.startswith("NOT APPLIED: invalid declaration: ") and "not needed" not in said_state, said_state
        lines = []
        describe_fix(fix, lines.append)  # `hotfix status --verbose` lists no range it cannot read
        assert fix.uncovered_here() is None and fix.mechanisms_here() == () and fix.distributions == ()
    assert len(caplog.records) == 1  # said once, however often it is checked


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("raw, disabled", [(None, False), ("", False), (" on ", True), ("OFF", False), ("maybe", True)])
def test_parse_disable(raw, disabled):
    assert parse_disable(raw) is disabled


def test_parse_patch_list_and_log_level():
    assert parse_patch_list(" Transformers_Checkpoint-Layer_IO , ,x ") == {"transformers-checkpoint-layer-io", "x"}
    assert parse_log_level(" info ") == "INFO" and parse_log_level("loud") is None and parse_log_level("") is None


# --------------------------------------------------------------------------- reload watcher
def test_reload_watcher_acts_on_reload_only(tmp_path, monkeypatch):
    (tmp_path / "unit_reloaded.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    watcher = ReloadWatcher(lambda: {"unit_reloaded"}, lambda module: calls.append(module.VALUE))
    sys.meta_path.insert(0, watcher)
    try:
        module = importlib.import_module("unit_reloaded")
        assert calls == []  # an ordinary import is not a reload
        (tmp_path / "unit_reloaded.py").write_text("VALUE = 2  # changed\n")
        importlib.invalidate_caches()
        importlib.reload(module)
        assert calls == [2]
        assert type(module.__loader__).__name__ == "SourceFileLoader"  # the proxy left no trace
    finally:
        sys.meta_path.remove(watcher)
        sys.modules.pop("unit_reloaded", None)


# --------------------------------------------------------------------------- checkpoint slot
def _tag(label):
    def wrapper(wrapped, instance, args, kwargs):
        return (label, wrapped(*args, **kwargs))
    return wrapper


class Base(torch.nn.Module):
    pass


class Layer(Base):
    pass


def test_slots_compose_by_rank_whichever_class_holds_them_and_the_instance_keeps_the_raw_function():
    compiling = []
    # The slot on the base class ranks higher: it wraps outermost although the subclass's is nearer.
    slots = {Base: CheckpointFunctionSlot(Base, _tag("base"), lambda: bool(compiling), rank=20),
             Layer: CheckpointFunctionSlot(Layer, _tag("layer"), lambda: bool(compiling), rank=10)}
    for owner, slot in slots.items():
        setattr(owner, ATTRIBUTE, slot)
    try:
        layer = Layer()
        assert getattr(layer, ATTRIBUTE) is None  # unset reads as None (dir()/getattr loops work)
        setattr(layer, ATTRIBUTE, lambda x: x + 1)
        raw = layer.__dict__[ATTRIBUTE]
        assert getattr(layer, ATTRIBUTE)(1) == ("base", ("layer", 2))
        assert getattr(Base(), ATTRIBUTE) is None
        compiling.append(True)
        assert getattr(layer, ATTRIBUTE) is raw  # dynamo gets the raw function
        compiling.clear()
        setattr(layer, ATTRIBUTE, functools.partial(max, 0))
        clone = copy.deepcopy(layer)
        assert pickle.loads(pickle.dumps(layer)).__dict__[ATTRIBUTE].func is max
        assert getattr(clone, ATTRIBUTE)(5) == ("base", ("layer", 5))
    finally:
        for owner in slots:
            delattr(owner, ATTRIBUTE)


def test_a_non_reentrant_stored_function_runs_without_the_slots_that_act_on_reentrant_calls_only():
    """transformers 5.x's default (``partial(checkpoint, use_reentrant=False)``): where every slot acting on the
    function acts on reentrant calls only, a call is the stored function's own (no slot layer: ~5 µs a call); a
    call that passes ``use_reentrant=True`` itself still goes through them.  A slot acting on non-reentrant calls
    too (unsloth-zoo-nonreentrant-offload's kind) keeps every layer in the call."""
    def checkpoint(function, *args, use_reentrant=None):
        return ("ran", use_reentrant, function(*args))

    slots = {Base: CheckpointFunctionSlot(Base, _tag("base"), lambda: False, rank=20, reentrant_only=True),
             Layer: CheckpointFunctionSlot(Layer, _tag("layer"), lambda: False, rank=10, reentrant_only=True)}
    for owner, slot in slots.items():
        setattr(owner, ATTRIBUTE, slot)
    try:
        layer = Layer()
        setattr(layer, ATTRIBUTE, functools.partial(checkpoint, use_reentrant=False))
        stored = getattr(layer, ATTRIBUTE)
        assert stored(abs, -2) == ("ran", False, 2)  # no slot in the call
        assert stored(abs, -2, use_reentrant=True) == ("base", ("layer", ("ran", True, 2)))
        assert stored.keywords == {"use_reentrant": False}  # read as the stored function
        setattr(layer, ATTRIBUTE, functools.partial(checkpoint, use_reentrant=True))
        assert getattr(layer, ATTRIBUTE)(abs, -2) == ("base", ("layer", ("ran", True, 2)))
        slots[Layer].reentrant_only = False  # a slot that acts on non-reentrant calls too: every slot stays
        setattr(layer, ATTRIBUTE, functools.partial(checkpoint, use_reentrant=False))
        setattr(Layer, ATTRIBUTE, slots[Layer])  # (the class's entry read again: the composition is made anew)
        assert getattr(layer, ATTRIBUTE)(abs, -2) == ("base", ("layer", ("ran", False, 2)))
    finally:
        for owner in slots:
            delattr(owner, ATTRIBUTE)


def test_the_composition_is_made_once_per_class_and_function_and_again_when_what_decides_it_changes():
    """Issue 52 part 1: a read no longer walks the MRO, asks every slot and builds wrappers; it reuses the
    composition made for (class, function) while the slots standing on the MRO are the same objects and every
    answer that may change (``settled`` False) is unchanged.  Each change below must show in the next read."""
    asked = []
    serving = {"fork": True}

    def serves_fork(raw):
        asked.append(raw)
        return serving["fork"] if raw is fork_function else True

    def settled(raw):
        return raw is not fork_function

    fork_function = functools.partial(min, 9)
    slot = CheckpointFunctionSlot(Layer, _tag("layer"), lambda: False, rank=10, serves=serves_fork, settled=settled)
    Layer._gradient_checkpointing_func = slot
    try:
        layer = Layer()
        layer._gradient_checkpointing_func = raw = functools.partial(max, 0)
        with mock.patch.object(wrapt, "FunctionWrapper", wraps=wrapt.FunctionWrapper) as built:
            first = getattr(layer, ATTRIBUTE)
            assert all(getattr(layer, ATTRIBUTE) is first for _ in range(100)) and getattr(Layer(), ATTRIBUTE) is None
            assert built.call_count == 1 and asked == [raw]  # composed once, serves asked once (settled)
            # a slot put on a base class later (another fix covering it): the next read composes with it
            Base._gradient_checkpointing_func = CheckpointFunctionSlot(Base, _tag("base"), lambda: False, rank=20)
            assert getattr(layer, ATTRIBUTE)(5) == ("base", ("layer", 5)) and built.call_count == 3
            del Base._gradient_checkpointing_func  # reverted: the base's wrapper goes at the next read
            assert getattr(layer, ATTRIBUTE)(5) == ("layer", 5)
            # another function stored: composed for it
            layer._gradient_checkpointing_func = fork_function
            assert getattr(layer, ATTRIBUTE)(5) == ("layer", 5)
            # an answer that may change (a fork's function) is asked at every read and followed
            asked.clear()
            serving["fork"] = False
            assert getattr(layer, ATTRIBUTE) is fork_function and len(asked) >= 1
            serving["fork"] = True
            assert getattr(layer, ATTRIBUTE)(5) == ("layer", 5)
    finally:
        del Layer._gradient_checkpointing_func


def _dynamo_reads(module, name):
    """What dynamo makes of ``module.<name>`` (torch 2.4 - 2.8's UserDefinedObjectVariable.var_getattr): a
    ``property`` found statically on the class is traced through its ``fget``; any other class attribute
    found first by ``inspect.getattr_static`` (a data descriptor wins over the instance dict) is the value."""
    found = inspect.getattr_static(module, name)
    return found.fget(module) if isinstance(found, property) else found


def test_dynamo_of_every_torch_line_reads_the_raw_function_through_the_slot():
    """Before the slot was a property, dynamo 2.4 - 2.8 took the slot object for the checkpoint function and
    failed its own guard check ("Guard check failed: ___check_type_id(self._gradient_checkpointing_func")."""
    slot = CheckpointFunctionSlot(Layer, _tag("layer"), lambda: False, rank=10)
    Layer._gradient_checkpointing_func = slot
    try:
        shared = functools.partial(max, 0)
        first, second = Layer(), Layer()
        first._gradient_checkpointing_func = second._gradient_checkpointing_func = shared
        assert _dynamo_reads(first, ATTRIBUTE) is shared and _dynamo_reads(second, ATTRIBUTE) is shared
        # Two models' layers hold two functions: each reads its own, without reading the attribute (dynamo
        # before 2.13 answers that through the slot again: RecursionError).
        other = functools.partial(min, 0)
        second._gradient_checkpointing_func = other
        with mock.patch.object(CheckpointFunctionSlot, "__get__", side_effect=AssertionError("read through the slot")):
            assert _dynamo_reads(first, ATTRIBUTE) is shared and _dynamo_reads(second, ATTRIBUTE) is other
            assert _dynamo_reads(Layer(), ATTRIBUTE) is None
        assert getattr(first, ATTRIBUTE)(5) == ("layer", 5)  # eager reads: hotfix's wrapper
    finally:
        del Layer._gradient_checkpointing_func


def test_a_slot_that_displaces_another_fixes_slot_keeps_it_working_and_gives_it_back():
    """Two fixes cover the same class (an encoder that calls its checkpoint function itself): the second
    slot displaces the first on the class dict, both still wrap by rank, and reverting newest first
    leaves the class exactly as it was."""

    class Fix(Patch):
        targets = ("unit_target",)

    class Encoder(torch.nn.Module):
        pass

    outer, inner = Fix(), Fix()
    outer.name, inner.name = "outer", "inner"
    model = Encoder()
    model._gradient_checkpointing_func = lambda x: x + 1
    SlotCoverage(outer, _tag("outer"), rank=20).cover(model)
    first = Encoder.__dict__[ATTRIBUTE]
    coverage = SlotCoverage(inner, _tag("inner"), rank=10)
    coverage.cover(model)
    coverage.cover(model)  # covered already: nothing stacks
    assert Encoder.__dict__[ATTRIBUTE].displaced is first
    assert getattr(model, ATTRIBUTE)(1) == ("outer", ("inner", 2))
    assert inner.revert() and Encoder.__dict__[ATTRIBUTE] is first
    assert getattr(model, ATTRIBUTE)(1) == ("outer", 2)
    assert outer.revert() and ATTRIBUTE not in Encoder.__dict__
    assert getattr(model, ATTRIBUTE)(1) == 2
