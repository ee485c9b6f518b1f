"""patches/unsloth_zoo_*.py against real unsloth-zoo releases, on CPU.

Each release's real ``unsloth_zoo/gradient_checkpointing.py`` is loaded in a
fresh interpreter by zoo_loader.py (stub package + device_type, CUDA init
stubbed, unsloth's own swap of torch's CheckpointFunction installed), once with
HOTFIX_DISABLE=1 (upstream behaviour: each defect must reproduce, or the test
proves nothing) and once with hotfix active.  "equal" means every parameter
gradient matches a run without checkpointing within 1e-6 relative
(hotfix.diagnostics.compare).

Releases: 2025.11.3 (all three defects), 2025.11.5 (first-step offload fixed),
2026.8.9 (last with the frozen-args[0] bug), 2026.10.9 (latest: only the
closure-tensor bug is left).
"""

from __future__ import annotations

import textwrap

import pytest

from conftest import hotfix_lines, json_lines, matrix_path, matrix_versions, run_python

BACKWARD_TWICE = "Trying to backward through the graph a second time"
WRONG_GRAD_COUNT = "UnslothCheckpointFunctionBackward returned an incorrect number of gradients"
OFFLOAD_MESSAGE = "Unsloth: Will smartly offload gradients to save VRAM!"
ZOO_ONLY = {"HOTFIX_DISABLED_PATCHES": "transformers-checkpoint-layer-io"}
ZOO_OPTED_OUT = {"HOTFIX_DISABLED_PATCHES": "unsloth-zoo-closure-tensors,unsloth-zoo-offload-backward"}

# Upstream behaviour as measured (see /work/unsloth_research/REPORT.md section 7).
# offload: how many of the 4 layers upstream offloads in steps 1..3 (layer 1's
# input is below the size threshold; from step 2 the last layer is skipped).
UPSTREAM = {
    "2025.11.3": dict(frozen="crash", offload=[0, 2, 2]),
    "2025.11.5": dict(frozen="crash", offload=[3, 2, 2]),
    "2026.8.9": dict(frozen="crash", offload=[3, 2, 2]),
    "2026.10.9": dict(frozen="equal", offload=[3, 2, 2]),
}
# Patches applied by hotfix, per release.
APPLIED = {
    "2025.11.3": {"unsloth-zoo-closure-tensors", "unsloth-zoo-offload-backward", "unsloth-zoo-nonreentrant-offload",
                  "unsloth-zoo-pinned-memory"},
    "2025.11.5": {"unsloth-zoo-closure-tensors", "unsloth-zoo-offload-backward", "unsloth-zoo-nonreentrant-offload",
                  "unsloth-zoo-pinned-memory"},
    "2026.8.9": {"unsloth-zoo-closure-tensors", "unsloth-zoo-offload-backward", "unsloth-zoo-pinned-memory"},
    "2026.10.9": {"unsloth-zoo-closure-tensors"},
}
VERSIONS = [v for v in matrix_versions("unsloth-zoo") if v in UPSTREAM]


def _run(version, cases, then=None, late=False, env=None, transformers=None):
    """{(phase, case): result}.  With ``then``: ``cases`` run with HOTFIX_DISABLE=1
    (upstream), then hotfix is activated in the same process, on the release
    already loaded and swapped in, and ``then`` runs with it."""
    args = ["-P", "-m", "hotfix_lab.cases.zoo_cases"] + (["--late"] if late else []) + list(cases)
    child_env = dict(env or {})
    if then is not None:
        args += ["--activate"] + list(then)
        child_env["HOTFIX_DISABLE"] = "1"
    path = [matrix_path("unsloth-zoo", version)] + ([matrix_path("transformers", transformers)] if transformers else [])
    proc = run_python(args, env=child_env, pythonpath=path, timeout=300)
    results = {(r["phase"], r["case"]): r for r in json_lines(proc.stdout)}
    first = "upstream" if then is not None else "hotfix"
    expected = [(first, c) for c in cases] + [("hotfix", c) for c in then or ()]
    assert all(key in results for key in expected), proc.stdout[-2000:] + proc.stderr[-3000:]
    return results


def _equal(result):
    assert result["status"] == "equal", result
    assert result.get("missing", 0) == 0 and result.get("wrong", 0) == 0
    assert result.get("max_error", 0.0) <= 1e-6


def test_matrix_lists_the_releases_under_test():
    assert set(VERSIONS) == set(UPSTREAM), "tests/matrix.txt must list " + ", ".join(UPSTREAM)


UPSTREAM_CASES = ["whisper", "closure", "frozen", "offload"]
HOTFIX_CASES = ["whisper", "whisper-frozen", "closure", "frozen", "offload", "status", "revert"]


@pytest.mark.parametrize("version", VERSIONS)
def test_release_without_then_with_hotfix(version):
    """Each defect of this release reproduces upstream, then hotfix (activated on the
    loaded release) fixes exactly those, and `hotfix status` says why."""
    results = _run(version, UPSTREAM_CASES, then=HOTFIX_CASES)
    _check_upstream(version, {case: r for (phase, case), r in results.items() if phase == "upstream"})
    _check_hotfix(version, {case: r for (phase, case), r in results.items() if phase == "hotfix"})


def _check_upstream(version, got):
    """HOTFIX_DISABLE=1: every defect this release has shows up, as users see it."""
    header = got["header"]
    assert header["version"] == version  # importlib.metadata sees the release ('unsloth-zoo')
    assert not header["hotfix_active"] and header["checkpoint_function_is_unsloth"]
    # D1 on every release: the real Whisper through unsloth's Function, and a direct apply.
    for case in ("whisper", "closure"):
        assert got[case]["status"] == "crash" and BACKWARD_TWICE in got[case]["error"], got[case]
    assert got["whisper"]["unsloth_nodes"] > 0  # the crash is inside UnslothCheckpointFunction
    # frozen first input: broken until 2026.8.10
    expected = UPSTREAM[version]
    assert got["frozen"]["status"] == expected["frozen"], got["frozen"]
    if expected["frozen"] == "crash":
        assert WRONG_GRAD_COUNT in got["frozen"]["error"]
    # late offload until 2025.11.4: nothing offloaded in step 1
    steps = got["offload"]["steps"]
    assert [s["offloaded_count"] for s in steps] == expected["offload"]
    assert all(s["status"] == "equal" for s in steps)


def _check_hotfix(version, got):
    header = got["header"]
    assert header["hotfix_active"] and header["version"] == version
    applied = {name for name, on in header["applied"].items() if on and name.startswith("unsloth-zoo")}
    assert applied == APPLIED[version]

    # closure tensors, both call paths, and the frozen first input on a real model (frozen decoder embeddings:
    # args[0] frozen, encoder_hidden_states lifted into an input needing grad).
    for case in ("whisper", "whisper-frozen"):
        _equal(got[case])
        assert got[case]["unsloth_nodes"] == 4  # all 4 layers ran through UnslothCheckpointFunction
    _equal(got["closure"])
    _equal(got["frozen"])

    steps = got["offload"]["steps"]
    for step in steps:
        _equal(step)
    if "unsloth-zoo-offload-backward" in applied:
        # ours: from step 1, everything above the threshold; from step 2 not the last layer
        assert [s["offloaded"] for s in steps] == [[2, 3, 4], [2, 3], [2, 3]]
        assert [s["new_host_allocations"] for s in steps] == [3, 0, 0]  # host buffers reused
        assert [s["messages"] for s in steps] == [1, 0, 0]
        assert steps[0]["printed"] == OFFLOAD_MESSAGE + "\n"  # exactly upstream's line, once
        assert got["offload"]["reloads"] == 3 + 2 + 2
        _assert_stream_order(got["offload"]["log"])
    else:
        # 2026.8.11+: upstream's own (correct) offload is left in place
        assert [s["offloaded_count"] for s in steps] == UPSTREAM[version]["offload"]
        assert "offloaded" not in steps[0]

    status = got["status"]["text"]
    assert "unsloth-zoo-closure-tensors: APPLIED to unsloth_zoo.gradient_checkpointing" in status
    if "unsloth-zoo-offload-backward" in applied:
        assert "unsloth-zoo-offload-backward: APPLIED to unsloth_zoo.gradient_checkpointing" in status
        # the mechanisms in range here: both before 2025.11.5, the frozen first input alone after
        assert "[here] frozen-first-input (unsloth-zoo >=2025.1.1,<2026.8.11)" in status
        late_here = "[here] late-offload (unsloth-zoo >=2025.1.1,<2025.11.5)" in status
        assert late_here is (version == "2025.11.3"), status
    else:
        assert "unsloth-zoo-offload-backward: not needed here" in status
        assert f"unsloth-zoo {version} is outside the affected range >=2025.1.1,<2026.8.11" in status

    revert = got["revert"]
    assert set(APPLIED[version]) <= set(revert["reverted"])
    assert not revert["apply_wrapped"] and revert["methods_from_release"]
    assert revert["frozen_after_revert"] == UPSTREAM[version]["frozen"]


def _assert_stream_order(log):
    """Side waits for compute before each copy; compute waits for side after it."""
    copies = [i for i, e in enumerate(log) if e[0] == "copy"]
    assert copies
    for i in copies:
        assert log[i][2] == "side"  # every copy runs on the side stream
        assert log[i - 1] == ["wait", "side", "compute"], log[i - 3:i + 2]
        later_waits = [e for e in log[i + 1:] if e[0] == "wait"]
        assert later_waits and later_waits[0] == ["wait", "compute", "side"], log[i:i + 4]
        if log[i][1] == "to_device":  # the reloaded tensor is used right after
            assert log[i + 1] == ["wait", "compute", "side"]


@pytest.mark.parametrize("transformers", ["5.0.0", "5.23.0"])
def test_frozen_base_and_nested_outputs_through_unsloths_function_on_transformers_5(transformers):
    """Issue 11: unsloth-zoo forces use_reentrant=True on transformers 5.x.  Whisper with adapters on q/v
    (PEFT LoRA, and the same without peft), base frozen, no enable_input_require_grads(): no layer input
    needs grad, so upstream's loss has no graph at all; with hotfix (transformers-frozen-inputs, gated on
    the mechanism, not on 4.x) every adapter gradient equals a run without checkpointing, and every layer
    ran through UnslothCheckpointFunction."""
    cases = ["whisper-qv-no-hook", "whisper-lora-no-hook"]
    results = _run("2026.10.9", cases + ["pvt-v2"], then=cases + ["pvt-v2"], transformers=transformers)
    for case in cases:
        upstream, fixed = results[("upstream", case)], results[("hotfix", case)]
        assert upstream["status"] == "crash" and "does not require grad" in upstream["error"], upstream
        _equal(fixed)
        assert fixed["summary"].startswith("24/24"), fixed
        assert fixed["unsloth_nodes"] == 4, fixed
    assert results[("hotfix", "header")]["applied"]["transformers-frozen-inputs"]
    # Nested outputs (pvt_v2 stages return ((hidden,), h, w)): upstream silently loses 52 of 54 gradients
    # through unsloth's Function as through torch's; with hotfix they are checkpoint outputs.
    upstream, fixed = results[("upstream", "pvt-v2")], results[("hotfix", "pvt-v2")]
    assert upstream["status"] == "differs" and upstream["missing"] == 52, upstream
    _equal(fixed)
    assert fixed["unsloth_nodes"] == 2, fixed


@pytest.mark.parametrize("version", ["2025.11.5", "2026.8.9"])
def test_the_transformers_fixes_with_the_zoo_fixes_opted_out(version):
    """Issue 31 item 11: with both unsloth-zoo fixes opted out (hotfix's transformers fixes on), Whisper with
    adapters on q/v and no enable_input_require_grads() crashed with "UnslothCheckpointFunctionBackward returned
    an incorrect number of gradients": the frozen-inputs anchor (and lifted encoder states) came after a frozen
    first input, and these releases' own backward then returns one gradient (frozen-first-input, 2025.1.1 -
    2026.8.10).  Upstream the loss has no graph at all ("does not require grad"); now the anchor goes first
    and every adapter gradient equals a run without checkpointing."""
    cases = ["whisper-qv-no-hook", "whisper-lora-no-hook"]
    results = _run(version, cases, then=cases + ["whisper"], env=ZOO_OPTED_OUT)
    header = results[("hotfix", "header")]
    assert not any(header["applied"][name] for name in ("unsloth-zoo-offload-backward", "unsloth-zoo-closure-tensors"))
    assert header["applied"]["transformers-frozen-inputs"] and header["applied"]["transformers-checkpoint-layer-io"]
    for case in cases:
        upstream, fixed = results[("upstream", case)], results[("hotfix", case)]
        assert upstream["status"] == "crash" and "does not require grad" in upstream["error"], upstream
        _equal(fixed)
        assert fixed["summary"].startswith("24/24") and fixed["unsloth_nodes"] == 4, fixed
    _equal(results[("hotfix", "whisper")])  # first inputs needing grad: no anchor, lifted encoder states


# unsloth-zoo-closure-tensors with unsloth-zoo-offload-backward opted out: a tensor bound in the partial, the
# first input frozen (a layer whose hidden states come from frozen embeddings), straight through unsloth's apply.
CLOSURE_FROZEN_FIRST = textwrap.dedent(
    """
    import functools, json
    import hotfix  # activates: the release's patches arrive through the post-import hooks
    from hotfix_lab.infra.zoo_loader import install_unsloth_swap, load_release
    import torch

    gc = load_release()
    install_unsloth_swap(gc)
    torch.manual_seed(0)
    encoder, layer = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    x, hidden = torch.randn(3, 8), torch.randn(3, 8)  # hidden: needs no grad

    def call(h, context):
        return torch.tanh(layer(h) + context)

    def grads(checkpointed):
        encoder.zero_grad(set_to_none=True), layer.zero_grad(set_to_none=True)
        context = encoder(x)
        bound = functools.partial(call, context=context)
        out = gc.UnslothCheckpointFunction.apply(bound, True, hidden) if checkpointed else bound(hidden)
        out.sum().backward()
        return [p.grad for p in (*encoder.parameters(), *layer.parameters())]

    reference = grads(False)
    try:
        got = grads(True)
    except RuntimeError as exc:
        print(json.dumps({"error": str(exc).splitlines()[0]}))
    else:
        print(json.dumps({"equal": all(g is not None and torch.allclose(g, r, rtol=1e-6, atol=0)
                                       for g, r in zip(got, reference))}))
    """
)


def test_the_closure_fix_behind_a_frozen_first_input_with_the_offload_fix_opted_out():
    """The closure fix lifted the bound tensor behind a frozen first input, and the release's own backward
    (unsloth-zoo-offload-backward opted out) returned one gradient: a crash where upstream's is "does not
    require grad".  Now the lifted input follows a 0-byte anchor that needs grad: every gradient equal."""
    path = [matrix_path("unsloth-zoo", "2025.11.5")]
    upstream = run_python(["-c", CLOSURE_FROZEN_FIRST], env={"HOTFIX_DISABLE": "1"}, pythonpath=path, timeout=300)
    assert "does not require grad" in json_lines(upstream.stdout)[0]["error"], upstream.stdout + upstream.stderr
    fixed = run_python(["-c", CLOSURE_FROZEN_FIRST], env={"HOTFIX_DISABLED_PATCHES": "unsloth-zoo-offload-backward"},
                       pythonpath=path, timeout=300)
    assert json_lines(fixed.stdout) == [{"equal": True}], fixed.stdout + fixed.stderr[-3000:]
    assert not hotfix_lines(fixed.stderr), fixed.stderr[-3000:]


def test_late_activation_and_zoo_patch_alone():
    """hotfix imported after the release and after unsloth swapped torch's Function,
    with the transformers patch opted out: the zoo patch alone fixes the HF path."""
    results = _run("2025.11.3", ["whisper", "whisper-frozen", "closure", "frozen"], late=True, env=ZOO_ONLY)
    got = {case: r for (_, case), r in results.items()}
    header = got["header"]
    assert not header["hotfix_imported_before_release"]
    assert not header["applied"]["transformers-checkpoint-layer-io"]
    assert header["applied"]["unsloth-zoo-closure-tensors"] and header["applied"]["unsloth-zoo-offload-backward"]
    for case in ("whisper", "whisper-frozen", "closure", "frozen"):
        _equal(got[case])


def test_drift_skips_with_one_warning_each():
    proc = run_python(["-P", "-m", "hotfix_lab.cases.zoo_cases", "drift"], pythonpath=[matrix_path("unsloth-zoo", "2025.11.3")],
                      timeout=120)
    lines = json_lines(proc.stdout)
    assert len(lines) == 1, proc.stderr[-3000:]
    got = lines[0]
    zoo_fixes = {"unsloth-zoo-closure-tensors", "unsloth-zoo-offload-backward", "unsloth-zoo-nonreentrant-offload",
                 "unsloth-zoo-pinned-memory"}
    assert got["applied"] == dict.fromkeys(zoo_fixes, False)
    # one line per fix that targets the release: the zoo fixes, torch-ddp-find-unused (for unsloth's class in
    # torch's place; it stays applied to torch's own) and moe-routing-replay (its regions on unsloth's class)
    targeting = zoo_fixes | {"torch-ddp-find-unused", "moe-routing-replay"}
    assert len(got["warnings"]) == len(targeting), got["warnings"]
    assert sorted(next(n for n in targeting if f"patch {n} skipped" in w) for w in got["warnings"]) == sorted(targeting)
    for name, error in got["errors"].items():
        # the fake release has no set-up function at all: the pinned-memory fix says that instead
        expected = "initialize_unsloth_gradient_checkpointing is missing" if name == "unsloth-zoo-pinned-memory" \
            else "preserve_rng_state"
        assert error.startswith("skipped, target changed:") and expected in error, (name, error)
    assert got["grad"] == [2.0, 2.0] and got["apply_is_inherited"]  # the user's code still runs


def test_status_cli_reports_unimportable_zoo():
    """`python -m hotfix status` with a real release but no GPU: reported, not raised."""
    proc = run_python(["-m", "hotfix", "status"], pythonpath=[matrix_path("unsloth-zoo", "2026.10.9")], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "unsloth-zoo 2026.10.9" in out
    assert "unsloth-zoo-closure-tensors: target failed to import:" in out
    assert "unsloth-zoo-offload-backward: not needed here" in out
