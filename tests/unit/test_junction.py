"""hotfix.junction: fixes that wrap one attribute share one wrapper, their hooks in relations.JOIN_ORDER (issue 52
part 1: three stacked FunctionWrappers on torch's CheckpointFunction.apply bound a classmethod three times a call)."""

from __future__ import annotations

import types

from hotfix import relations
from hotfix.junction import Junction, hooks_on
from hotfix.patch import Patch


class Function:
    @classmethod
    def apply(cls, function, flag, *inputs):
        return cls.__name__, function(*inputs)


class Subclass(Function):  # inherits apply, as UnslothCheckpointFunction does torch's Function.apply
    pass


def _fix(name):
    class Fix(Patch):
        targets = ("unit_junction_target",)

    fix = Fix()
    fix.name = name
    return fix


def _tagging(label, seen):
    def hook(wrapped, instance, args, kwargs):
        seen.append((label, instance))
        function = args[0]
        return wrapped(lambda *inputs: (label, function(*inputs)), *args[1:], **kwargs)

    return hook


def test_hooks_run_in_join_order_whatever_order_the_fixes_joined_in_and_a_revert_gives_back_what_it_found():
    inner, outer = relations.JOIN_ORDER[-1], relations.JOIN_ORDER[0]
    third_party, late = _fix("zz-third-party"), _fix(inner)
    first = _fix(outer)
    seen = []
    original = Subclass.__dict__.get("apply")
    assert original is None  # inherited
    late.join(Subclass, "apply", _tagging("inner", seen))
    after_inner = Subclass.__dict__["apply"]
    third_party.join(Subclass, "apply", _tagging("third", seen))
    after_third = Subclass.__dict__["apply"]
    first.join(Subclass, "apply", _tagging("outer", seen))
    first.join(Subclass, "apply", _tagging("outer", seen))  # joined already: nothing stacks
    try:
        junction = Subclass.__dict__["apply"]
        assert isinstance(junction, Junction) and hooks_on(junction) == (outer, inner, "zz-third-party")
        # one binding: every hook sees the class the call came through; the outermost changes the call first
        assert Subclass.apply(lambda x: x + 1, True, 1) == ("Subclass", ("third", ("inner", ("outer", 2))))
        assert [label for label, _ in seen] == ["outer", "inner", "third"] and {c for _, c in seen} == {Subclass}
        assert Function.apply(lambda x: x, True, 0) == ("Function", 0)  # the base class is untouched
    finally:
        assert first.revert() and Subclass.__dict__["apply"] is after_third
        assert third_party.revert() and Subclass.__dict__["apply"] is after_inner
        assert late.revert() and "apply" not in Subclass.__dict__


def test_a_module_function_joins_alike():
    module = types.ModuleType("unit_junction_module")

    def generator(function, flag):
        return function(flag)

    module.generator = generator
    rng, moe = _fix("torch-checkpoint-rng-state"), _fix("moe-routing-replay")
    seen = []
    moe.join(module, "generator", _tagging("moe", seen))
    rng.join(module, "generator", _tagging("rng", seen))
    assert module.generator(lambda flag: flag, 7) == ("moe", ("rng", 7))
    assert [label for label, _ in seen] == ["rng", "moe"] and seen[0][1] is None
    assert rng.revert() and moe.revert() and module.generator is generator


def test_a_fix_reverted_out_of_order_takes_only_its_own_hook_out():
    """Stacked wrappers could not: reverting a fix put back what it had found and dropped every wrapper put on after
    it (a test reverting torch-checkpoint-rng-state left torch-ddp-find-unused applied but gone from the call)."""
    names = relations.JOIN_ORDER[:3]
    fixes = [_fix(name) for name in names]
    seen = []
    for fix in fixes:  # joined in JOIN_ORDER: each later one outermost-last
        fix.join(Subclass, "apply", _tagging(fix.name, seen))
    assert hooks_on(Subclass.__dict__["apply"]) == names
    assert fixes[1].revert()  # the middle one first
    assert hooks_on(Subclass.__dict__["apply"]) == (names[0], names[2])
    seen.clear()
    assert Subclass.apply(lambda x: x, True, 1) == ("Subclass", (names[2], (names[0], 1)))
    assert [label for label, _ in seen] == [names[0], names[2]]
    assert fixes[0].revert() and hooks_on(Subclass.__dict__["apply"]) == (names[2],)
    assert fixes[2].revert() and "apply" not in Subclass.__dict__  # inherited again, as before any fix


def _idle_when_flag_true(label, seen):
    """A hook that hands on a call whose flag is True unchanged, and says so (``idle``)."""
    hook = _tagging(label, seen)

    def idle(instance, args, kwargs):
        return args[1] is True

    def idle_hook(wrapped, instance, args, kwargs):
        if idle(instance, args, kwargs):
            return wrapped(*args, **kwargs)
        return hook(wrapped, instance, args, kwargs)

    idle_hook.idle = idle
    return idle_hook


def test_where_every_hook_is_idle_the_original_runs_with_no_hook_in_between():
    outer, inner = _fix(relations.JOIN_ORDER[0]), _fix(relations.JOIN_ORDER[-1])
    seen = []
    outer.join(Subclass, "apply", _idle_when_flag_true("outer", seen))
    inner.join(Subclass, "apply", _idle_when_flag_true("inner", seen))
    try:
        assert Subclass.apply(lambda x: x + 1, True, 1) == ("Subclass", 2) and seen == []
        # one hook not idle: the whole chain runs, in order, as without the idle path
        assert Subclass.apply(lambda x: x + 1, False, 1) == ("Subclass", ("inner", ("outer", 2)))
        assert [label for label, _ in seen] == ["outer", "inner"]
    finally:
        assert inner.revert() and outer.revert() and "apply" not in Subclass.__dict__


def _asking(label, seen, idle, change=None):
    """A hook that says what it did: handed the call on (where ``idle``) or acted (``change`` applied to the args)."""
    def hook(wrapped, instance, args, kwargs):
        if idle(instance, args, kwargs):
            seen.append((label, "handed on"))
            return wrapped(*args, **kwargs)
        seen.append((label, "acted"))
        return (label, wrapped(*(change(args) if change else args), **kwargs))

    hook.idle = idle
    return hook


def test_the_outer_hooks_idle_for_a_call_are_left_out_and_an_inner_one_is_asked_about_the_call_as_changed():
    """The junction asks each hook's ``idle`` outermost first and runs the chain from the first that would act: the
    idle ones outside it add no frame (with a router found, every call runs moe-routing-replay's hook, innermost,
    while the DDP and RNG hooks outside it have nothing to do).  A hook inside the first acting one is asked again
    by the chain, about the call as that one changed it."""
    outer, inner = _fix(relations.JOIN_ORDER[0]), _fix(relations.JOIN_ORDER[-1])
    seen = []
    # outer: acts on a call whose first input is not 0, and sets its flag False; inner: acts where the flag is False
    outer.join(Subclass, "apply", _asking("outer", seen, lambda i, args, k: args[2] == 0,
                                          lambda args: (args[0], False, *args[2:])))
    inner.join(Subclass, "apply", _asking("inner", seen, lambda i, args, k: args[1] is True))
    try:
        assert Subclass.apply(lambda x: x + 1, False, 0) == ("inner", ("Subclass", 1))
        assert seen == [("inner", "acted")]  # the outer hook, idle for this call, did not run at all
        seen.clear()
        # the inner hook is idle for the call as made, not for the call as the outer hook changed it: asked again
        assert Subclass.apply(lambda x: x + 1, True, 1) == ("outer", ("inner", ("Subclass", 2)))
        assert seen == [("outer", "acted"), ("inner", "acted")]
    finally:
        assert inner.revert() and outer.revert() and "apply" not in Subclass.__dict__


def test_a_hook_without_idle_keeps_the_chain_for_every_call():
    first, other = _fix(relations.JOIN_ORDER[0]), _fix("zz-third-party")
    seen = []
    first.join(Subclass, "apply", _idle_when_flag_true("outer", seen))
    other.join(Subclass, "apply", _tagging("third", seen))
    try:
        assert Subclass.apply(lambda x: x, True, 0) == ("Subclass", ("third", 0))
        assert [label for label, _ in seen] == ["third"]  # the idle hook handed it on, the other acted
    finally:
        assert other.revert() and first.revert() and "apply" not in Subclass.__dict__
