"""Child of tests/versions/test_offload_stream_order.py: hotfix's offloader under the stream sanitizer, one release.

    python offload_stream_cases.py SCHEDULES [--mutants MAX_SCHEDULES] [--cases NAME,...]

The release (first on PYTHONPATH) is loaded on CPU by tools/hotfix_lab/infra/zoo_loader.py with
unsloth's own swap of torch's CheckpointFunction; hotfix is imported first, so
on releases it patches, Whisper's reentrant checkpointing runs hotfix's
forward/backward and its offloader, switched here to a StreamSanitizer (a new
one, seeded, per schedule).  Prints JSON lines: a header, one line per case
(every schedule's verdict summed up), and with --mutants one line per mutant
of the offloader (tests/support/offloader_mutants.py): per case, the first
schedule where the sanitizer caught it.
"""

from __future__ import annotations

import argparse
import gc as garbage
import json
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional

OFFLOAD_PATCH = "unsloth-zoo-offload-backward"
#: host and staging buffers are rounded up to this many bytes here instead of 64 KiB, so that the tiny
#: Whisper's activations (0.2 - 2 KiB) need bigger buffers when the batch grows: pool and staging reuse,
#: replacement and shrinking are exercised, as full-size activations exercise them with 64 KiB rounding.
ROUND_BYTES = 256


@dataclass(frozen=True)
class Step:
    batch: int
    labels: int
    dropped: Optional["Step"] = None  # first a forward whose graph is dropped without backward


#: batch sizes / label lengths grow, then shrink; step 2 starts with a forward whose graph is dropped
STEPS = (Step(2, 5), Step(3, 8, dropped=Step(2, 4)), Step(1, 3))
#: name -> (tools/tiny_models builder, virtual device of the encoder, of the decoder)
CASES = {
    "whisper-lora-two-devices": ("whisper-lora", 0, 1),  # two side streams, two pools, two staging buffers
    "whisper-full": ("whisper", 0, 0),  # one device: encoder and decoder share a pool and a staging buffer
}


def _batch(step: Step, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {"input_features": torch.randn(step.batch, 8, 20, generator=g),
            "labels": torch.randint(3, 100, (step.batch, step.labels), generator=g)}


class Case:
    """One model built once; every schedule re-runs the steps on it (weights never change)."""

    def __init__(self, name: str, offloader) -> None:
        from hotfix_lab.infra import tiny_models
        from hotfix.diagnostics.compare import collect_grads

        builder, encoder_device, decoder_device = CASES[name]
        self.name = name
        self.offloader = offloader
        self.model, _ = tiny_models.BUILDERS[builder]()
        self.batches = [_batch(step, 10 + i) for i, step in enumerate(STEPS)]
        self.dropped = {i: _batch(step.dropped, 20 + i) for i, step in enumerate(STEPS) if step.dropped}
        self.references = []
        for batch in self.batches:  # before checkpointing is switched on: the plain step
            self.model.zero_grad(set_to_none=True)
            self.model(**batch).loss.backward()
            self.references.append(collect_grads(self.model))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        self.two_devices = encoder_device != decoder_device
        for module in self.model.modules():
            kind = type(module).__name__
            if kind in ("WhisperEncoder", "WhisperDecoder"):
                index = encoder_device if kind == "WhisperEncoder" else decoder_device
                module.register_forward_pre_hook(lambda m, a, index=index: self.offloader.device.enter_device(index))
                module.register_forward_hook(lambda m, a, o: self.offloader.device.leave_device(), always_call=True)

    def schedule(self, seed: int) -> dict:
        from hotfix.diagnostics.compare import collect_grads, compare_grads
        from support.stream_sanitizer import StreamSanitizer

        sanitizer = StreamSanitizer(seed)
        self.offloader.use_device(sanitizer, threshold_bytes=0)  # forgets pools, staging, layer count
        wrong = []
        for i, batch in enumerate(self.batches):
            with sanitizer.tracking():
                if i in self.dropped:
                    output = self.model(**self.dropped[i])
                    del output
                    garbage.collect()  # the dropped graph's leases come back through HostLease.__del__
                self.model.zero_grad(set_to_none=True)
                self.model(**batch).loss.backward()
            report = compare_grads(self.references[i], collect_grads(self.model), rtol=1e-6)
            if not report.ok:
                wrong.append(f"step {i + 1}: {report.summary()}")
        return dict(sanitizer.summary(), seed=seed, wrong=wrong, offloaded=dict(self.offloader.stats.offloaded),
                    reloads=self.offloader.stats.reloads)


def _ranges(per_schedule: List[Dict[str, int]]) -> Dict[str, List[int]]:
    """counter name -> [lowest, highest] over the schedules (absent = 0)."""
    keys = sorted({key for stats in per_schedule for key in stats})
    return {key: [min(s.get(key, 0) for s in per_schedule), max(s.get(key, 0) for s in per_schedule)]
            for key in keys}


def run_case(case: Case, schedules: int) -> dict:
    started = time.perf_counter()
    results = [case.schedule(seed) for seed in range(schedules)]
    failures = [{k: r[k] for k in ("seed", "race_kinds", "messages", "wrong")}
                for r in results if r["races"] or r["wrong"]]
    eagerness: Dict[str, int] = {}
    for r in results:
        eagerness[str(r["eagerness"])] = eagerness.get(str(r["eagerness"]), 0) + 1
    return dict(case=case.name, schedules=schedules, clean=schedules - len(failures), failed=len(failures),
                failures=failures[:5], eagerness=eagerness, stats=_ranges([r["stats"] for r in results]),
                offloaded=results[0]["offloaded"], reloads=results[0]["reloads"], two_devices=case.two_devices,
                seconds=round(time.perf_counter() - started, 1))


def run_mutant(mutant, cases: List[Case], schedules: int) -> dict:
    """Each case's schedules in turn until the sanitizer reports the mutant (a race or a wrong gradient)."""
    from hotfix.diagnostics.compare import short_error

    offloader = cases[0].offloader
    original = type(offloader)
    offloader.__class__ = mutant.build()
    caught, run = {}, 0
    try:
        for case in cases:
            for seed in range(schedules):
                run += 1
                try:
                    result = case.schedule(seed)
                except Exception as exc:  # visible too, but not what the sanitizer is for: reported apart
                    caught[case.name] = dict(seed=seed, crash=short_error(exc))
                    break
                if result["races"] or result["wrong"]:
                    caught[case.name] = dict(seed=seed, race_kinds=result["race_kinds"],
                                             message=(result["messages"] or [None])[0], wrong=result["wrong"][:1])
                    break
    finally:
        offloader.__class__ = original
    return dict(mutant=mutant.id, name=mutant.name, caught_by=caught, schedules_run=run)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("schedules", type=int)
    parser.add_argument("--mutants", type=int, default=0, help="schedules per case at most, per mutant")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args(argv)

    import hotfix  # noqa: F401  (activates: the zoo patches arrive through post-import hooks)
    from hotfix_lab.infra import zoo_loader
    from hotfix.registry import registry
    from importlib import metadata

    zoo = zoo_loader.load_release()
    zoo_loader.install_unsloth_swap(zoo)
    patch = registry.patches().get(OFFLOAD_PATCH)
    applied = bool(patch is not None and patch.applied)
    print(json.dumps(dict(case="header", version=metadata.version("unsloth-zoo"), offload_patch_applied=applied,
                          forward_module=zoo.UnslothCheckpointFunction.forward.__module__)), flush=True)
    if not applied:
        return 0
    import torch

    import hotfix.checkpointing.offload.devices as devices

    torch.set_num_threads(1)  # tiny ops: threads only add spin-waits (and contend with a parallel child)
    devices.ROUND_BYTES = ROUND_BYTES
    patch.offloader.announce = lambda message: None  # unsloth's one-line notice, once per reset
    cases = [Case(name, patch.offloader) for name in args.cases.split(",")]
    # Everything built so far lives to the end: the collection that frees a dropped graph's cycles
    # (once per schedule) then scans only what the schedule made, not the ~300k objects of torch/transformers.
    garbage.freeze()
    for case in cases:
        print(json.dumps(run_case(case, args.schedules)), flush=True)
    if args.mutants:
        from support.offloader_mutants import mutants

        for mutant in mutants():
            print(json.dumps(dict(case="mutant", **run_mutant(mutant, cases, args.mutants))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
