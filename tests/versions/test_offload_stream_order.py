"""Stream ordering of hotfix's activation offload, proven on CPU (issue 24, part 2).

tests/test_unsloth_zoo_offload.py shows that the offloader *makes* its waits
(SimulatedDevice runs every copy at once).  Here tests/support/stream_sanitizer.py
shows they are *enough*: side-stream copies are queued and run at adversarial,
seeded points the recorded edges allow; every buffer is tracked with vector
clocks and poisoned when released or freed.  Each unsloth-zoo release of the
matrix is loaded on CPU (tools/hotfix_lab/infra/zoo_loader.py) in a child
(tests/support/offload_stream_cases.py) that trains tiny Whisper through the
release's UnslothCheckpointFunction: LoRA with the encoder on virtual device 0
and the decoder on device 1 (two side streams, pools and staging buffers), and
full fine-tuning on one device (encoder and decoder activations of different
sizes share a pool and a staging buffer); three steps whose batches grow then
shrink (pool and staging reuse and replacement), one of them after a forward
whose graph is dropped (its leases come back through HostLease.__del__).  Acceptance: no race and gradients equal
to no checkpointing (hotfix.diagnostics.compare, rtol 1e-6) in each of 200
schedules per case; and every mutant of the offloader (one wait removed, or the
lease released before the copy back is queued: tests/support/offloader_mutants.py,
built from the installed offloader's source) is caught in at least one case.

Sizes (tests/support/statistical_size.py): 200 schedules per case where the offloader, the offload fix, the
sanitizer or the case changed since the last full run (or ``HOTFIX_FULL_SIZE=1``), else 50: the code it guards
passed 200 as it is, and 50 still exercise every kind of schedule the assertions below require (copies run when
forced and early, long waits, pool and staging replacement, a dropped graph's leases).  The mutants' schedules
(at most 5 per case, until caught) are the same at either size: each missing edge is caught either way.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import TESTS, json_lines, matrix_path, matrix_versions, run_python
from support.offloader_mutants import UNCHANGED, mutants, wait_sites
from support.statistical_size import record_full_run, size_of
from support.stream_sanitizer import StreamSanitizer

#: releases where hotfix replaces UnslothCheckpointFunction's forward/backward (its offloader runs there)
PATCHED = ("2025.11.3", "2025.11.5", "2026.8.9")
#: >=2026.8.11 keeps upstream's own forward/backward: they drive CUDA streams directly, so on CPU
#: there is no offload of hotfix's to order (and upstream's own stream code is not what this proves)
NOT_APPLICABLE = {"2026.10.9": "unsloth-zoo 2026.10.9 is outside the offload patch's range (>=2025.1.1,<2026.8.11): "
                               "upstream's own forward/backward run, and they use CUDA streams directly"}
FULL_SCHEDULES, CI_SCHEDULES = 200, 50
#: the code whose change calls for the full size
GUARDS = ("hotfix/checkpointing/offload/*.py", "patches/unsloth_zoo_offload_backward.py",
          "tests/support/stream_sanitizer.py", "tests/support/offload_stream_cases.py",
          "tests/support/offloader_mutants.py", "tools/hotfix_lab/infra/zoo_loader.py")
TEST = "versions/test_offload_stream_order.py"
MUTANT_SCHEDULES = 5  # per case, at most, until caught
CASES = ("whisper-lora-two-devices", "whisper-full")
MUTANTS = [m for m in mutants() if m.name != UNCHANGED]


def _run(version: str, schedules: int) -> dict:
    """{"header": ..., case name: result, ("mutant", id): result} of one release's child."""
    args = [str(TESTS / "support" / "offload_stream_cases.py"), str(schedules), "--mutants", str(MUTANT_SCHEDULES)]
    if version in NOT_APPLICABLE:
        args = args[:2]
    proc = run_python(args, pythonpath=[matrix_path("unsloth-zoo", version)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = {}
    for line in json_lines(proc.stdout):
        results[("mutant", line["mutant"]) if line["case"] == "mutant" else line["case"]] = line
    return results


@pytest.fixture(scope="module")
def size():
    chosen = size_of(TEST, CI_SCHEDULES, FULL_SCHEDULES, GUARDS)
    print(f"{chosen.trials} schedules per case: {chosen.why}")
    passed = set()
    yield chosen, passed
    if chosen.full and passed == set(PATCHED):  # every release clean at the full size: CI's size until they change
        record_full_run(TEST, GUARDS)


@pytest.fixture(scope="module")
def release(size):
    """The children of every release run side by side (one core each, 2 cores in CI); tests wait on theirs."""
    versions = list(PATCHED) + list(NOT_APPLICABLE)
    pool = ThreadPoolExecutor(len(versions))
    futures = {version: pool.submit(_run, version, size[0].trials) for version in versions}
    yield lambda version: futures[version].result()
    pool.shutdown(wait=True, cancel_futures=True)


def test_matrix_lists_the_releases():
    assert set(matrix_versions("unsloth-zoo")) == set(PATCHED) | set(NOT_APPLICABLE)


@pytest.mark.parametrize("version", PATCHED)
def test_no_race_and_exact_gradients_under_adversarial_schedules(release, size, version):
    (schedules, _, _), passed = size
    results = release(version)
    header = results["header"]
    assert header["version"] == version and header["offload_patch_applied"], header
    assert header["forward_module"] == "hotfix.patches.unsloth_zoo_offload_backward", header
    for name in CASES:
        case = results[name]
        assert case["schedules"] == schedules, case
        assert case["clean"] == schedules, f"{case['failed']} schedules failed, e.g. {case['failures'][:2]}"
        stats = case["stats"]
        # the schedules were adversarial: some ran copies only when forced, others early, some waited long
        assert len(case["eagerness"]) >= 5, case["eagerness"]
        assert stats["ran when forced"][1] > 0 and stats["ran early"][1] > 0, stats
        assert stats["most points a copy waited"][1] >= 50, stats
        # every schedule: pools and staging replaced as batches grew, a dropped graph's leases came back
        # through the garbage collector, every released buffer was poisoned behind the work queued on it
        assert stats["host buffers allocated"][0] > len(case["offloaded"]["1"]), (stats, case["offloaded"])
        assert stats["staging buffers allocated"][0] >= 2, stats
        assert stats["released without a copy back (graph dropped)"][0] >= 1, stats
        assert stats["host buffers released"][0] == stats["released buffers poisoned"][0] > 0, stats
        assert case["reloads"] > 0
        sides = {key.split(" on ")[1] for key in stats if key.startswith("copies to_")}
        assert sides == ({"side:0", "side:1"} if case["two_devices"] else {"side:0"}), stats
        for side in sides:
            assert stats[f"copies to_host on {side}"][0] > 0 and stats[f"copies to_device on {side}"][0] > 0, stats
    passed.add(version)


@pytest.mark.parametrize("version", list(NOT_APPLICABLE))
def test_release_without_hotfixs_offloader_is_not_applicable(release, version):
    header = release(version)["header"]
    assert header["version"] == version and not header["offload_patch_applied"], header
    assert header["forward_module"] == "unsloth_zoo.gradient_checkpointing", header
    pytest.skip(f"n/a: {NOT_APPLICABLE[version]}")


def test_mutants_cover_every_wait_of_the_offloader():
    """One mutant per wait statement, found in the installed offloader's source (a wait added there adds one)."""
    assert [(method, source) for method, _, source in wait_sites()] == [
        ("offload", "self.device.wait(side, compute)"),
        ("after_forward",
         "self.device.wait(self.device.compute_stream(ticket.device), self.device.side_stream(ticket.device))"),
        ("reload", "self.device.wait(side, compute)"),
        ("reload", "self.device.wait(compute, side)"),
    ]
    assert len(MUTANTS) == len(wait_sites()) + 1  # and the early release


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_a_missing_edge_is_caught(release, mutant):
    for version in PATCHED:
        result = release(version)[("mutant", mutant.id)]
        caught = result["caught_by"]
        assert caught, f"{mutant.name}: no race and no wrong gradient on {version} in {result['schedules_run']} schedules"
        assert not any("crash" in c for c in caught.values()), caught


def test_the_unchanged_copy_of_the_offloader_is_clean(release):
    """The mutants' machinery itself (recompiled methods on a subclass) adds no race."""
    for version in PATCHED:
        result = release(version)[("mutant", "control")]
        assert result["caught_by"] == {}, result
        assert result["schedules_run"] == MUTANT_SCHEDULES * len(CASES)


# -- the sanitizer's own rules, on scripted copies (in process) --------------------------------------------
def _script(release_to: str, seed: int):
    """Offload one activation and bring it back (as the offloader does), release the host buffer right after
    the copy back is queued (compute has not waited), then a second offload writes the same buffer: from the
    same side stream (FIFO protects it) or from the other device's side stream with no edge."""
    sanitizer = StreamSanitizer(seed, eagerness=0.0 if seed == 0 else None)
    compute = sanitizer.compute
    side = sanitizer.side_stream(torch.device("cpu", 0))
    other = sanitizer.side_stream(torch.device("cpu", 1)) if release_to == "other stream" else side
    buffer = sanitizer.new_host_buffer(64)
    staging = sanitizer.new_device_buffer(64, torch.device("cpu", 0))
    first, second = torch.randn(16), torch.randn(16)
    with sanitizer.tracking():
        sanitizer.wait(side, compute)
        with sanitizer.on(side):
            sanitizer.copy(buffer.view(torch.float32), first, "to_host")
        sanitizer.wait(compute, side)
        sanitizer.wait(side, compute)
        with sanitizer.on(side):
            sanitizer.copy(staging.view(torch.float32), buffer.view(torch.float32), "to_device")
        sanitizer.host_buffer_released(buffer)
        sanitizer.wait(other, compute)
        with sanitizer.on(other):
            sanitizer.copy(buffer.view(torch.float32), second, "to_host")
        sanitizer.wait(compute, side)
        sanitizer.wait(compute, other)
    return sanitizer, staging.view(torch.float32), first


@pytest.mark.parametrize("seed", range(20))
def test_fifo_reuse_of_a_released_host_buffer_is_safe(seed):
    sanitizer, reloaded, first = _script("same stream", seed)
    assert sanitizer.summary()["races"] == 0, sanitizer.summary()
    assert torch.equal(reloaded, first)  # the copy back ran before the poison queued behind it
    assert sanitizer.stats["released buffers poisoned"] == 1


def test_reuse_from_another_stream_without_an_edge_is_a_race():
    sanitizer, _, _ = _script("other stream", 0)
    assert sanitizer.race_kinds["unordered"] >= 1, sanitizer.summary()


def test_an_activation_freed_before_its_copy_ran_is_a_race_and_reads_poison():
    sanitizer = StreamSanitizer(0, eagerness=0.0)
    compute, side = sanitizer.compute, sanitizer.side_stream(torch.device("cpu", 0))
    buffer = sanitizer.new_host_buffer(64)
    with sanitizer.tracking():
        activation = torch.randn(16) * 2  # made by a compute op
        sanitizer.wait(side, compute)
        with sanitizer.on(side):
            sanitizer.copy(buffer.view(torch.float32), activation.detach(), "to_host")
        del activation  # no wait(compute, side): the caching allocator may hand its memory to compute
        torch.zeros(1) + 1  # compute's next op
    assert sanitizer.race_kinds["freed-while-in-use"] == 1, sanitizer.summary()
    assert torch.isnan(buffer.view(torch.float32)).all()
