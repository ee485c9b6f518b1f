"""Benchmark 6: unsloth-zoo's offload path on CPU (hotfix_lab.infra.zoo_loader), upstream vs hotfix per release."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hotfix_lab.infra.paths import REPO, TOOLS
from hotfix_lab.bench.bench_common import CHILD_CWD, env_without_hotfix_vars, summary


# ---------------------------------------------------------------------------- 6 unsloth
UNSLOTH_RELEASES = ("2025.11.3", "2025.11.5", "2026.10.9")
UNSLOTH_NOTE = ("CPU only, through the test seam (tools/hotfix_lab/infra/zoo_loader.py): the 'host' copies are CPU->CPU memcpy "
                "(hotfix: SimulatedDevice; upstream: its own offload branch with fake streams), so step times "
                "show Python/bookkeeping and memcpy overhead, not PCIe transfers or stream overlap; bytes, layers "
                "and allocations are what a GPU run would do")


def bench_unsloth(reps, threads=None):
    from hotfix_lab.bench import unsloth_workload as workloads

    env = env_without_hotfix_vars()
    env["HOTFIX_DISABLE"] = "1"  # the child loads the release unpatched, then activates hotfix itself
    releases = {}
    for version in UNSLOTH_RELEASES:
        path = REPO / ".matrix" / f"unsloth-zoo-{version}"
        if not (path / ".complete").exists():
            print(f"  unsloth-zoo {version}: not installed under .matrix/ (scripts/test.sh installs it); skipped")
            continue
        env["PYTHONPATH"] = os.pathsep.join([str(path), str(TOOLS)])
        # One torch thread unless --threads says otherwise: the step is small, and on a shared
        # 2-vCPU machine two threads mostly measure contention (IQR > 100 % in trials).
        argv = [sys.executable, "-P", "-m", "hotfix_lab.bench.unsloth_workload", str(reps), str(threads or 1)]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=CHILD_CWD)
        if proc.returncode:
            raise RuntimeError(f"unsloth-zoo {version}: {proc.stderr[-3000:]}")
        releases[version] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not releases:
        return {"status": "no unsloth-zoo release installed under .matrix/"}

    MiB = 2 ** 20
    out = {}
    lines = [f"  {'release':<10} {'variant':<9} {'step':>4} {'layers offl.':>12} {'MiB to host':>11} "
             f"{'host allocs':>11} {'msg':>3} {'step time (median)':>26} {'patched/upstream':>16}"]
    for version, r in releases.items():
        steps = len(r["results"]["upstream"][0])
        per = {}  # variant -> step -> dict
        for variant, runs in r["results"].items():
            per[variant] = []
            for k in range(steps):
                samples = [run[k] for run in runs]

                def one(key, samples=samples):  # counts are deterministic: say so if they ever vary
                    values = {s[key] for s in samples}
                    return values.pop() if len(values) == 1 else f"{min(values)}-{max(values)}"

                per[variant].append(dict(
                    time=summary([s["seconds"] for s in samples]), layers=one("layers"),
                    bytes_to_host=one("bytes_to_host"), bytes_to_device=one("bytes_to_device"),
                    host_allocs=one("host_allocs"), messages=one("messages"),
                    grads_exact=all(s["max_rel_error"] <= 1e-6 for s in samples),
                    max_rel_error=max(s["max_rel_error"] for s in samples)))
            per[variant].append(dict(time=summary([sum(s["seconds"] for s in run) for run in runs])))
        label = "patched" if r["offload_patch"] else "patched*"
        for variant, name in (("upstream", "upstream"), ("hotfix", label)):
            for k, st in enumerate(per[variant]):
                t = st["time"]
                ratio = per["hotfix"][k]["time"]["median"] / per["upstream"][k]["time"]["median"]
                ratio = f"{ratio:.3f}" if variant == "hotfix" else ""
                timing = f"{t['median']:8.1f} ms (IQR {100 * t['iqr_rel']:4.1f}%)"
                if k == steps:
                    lines.append(f"  {version:<10} {name:<9} {'all':>4} {'':>12} {'':>11} {'':>11} {'':>3} "
                                 f"{timing:>26} {ratio:>16}")
                    continue
                mib = st["bytes_to_host"] / MiB if isinstance(st["bytes_to_host"], int) else st["bytes_to_host"]
                lines.append(f"  {version:<10} {name:<9} {k + 1:>4} {str(st['layers']) + '/' + str(r['layers']):>12} "
                             f"{mib:>11.1f} {st['host_allocs']!s:>11} {st['messages']!s:>3} {timing:>26} "
                             f"{ratio:>16}")
        up, fx = per["upstream"], per["hotfix"]
        out[f"{version} ratio step time patched / upstream"] = {
            **{f"step {k + 1}": round(fx[k]["time"]["median"] / up[k]["time"]["median"], 3) for k in range(steps)},
            f"all {steps} steps": round(fx[steps]["time"]["median"] / up[steps]["time"]["median"], 3)}
        out[f"{version} MiB offloaded per step upstream / patched"] = [
            f"{up[k]['bytes_to_host'] / MiB:.0f} / {fx[k]['bytes_to_host'] / MiB:.0f}" for k in range(steps)]
        out[f"{version} gradients exact (both variants, every step)"] = all(
            st["grads_exact"] for v in (up, fx) for st in v[:steps])
        out[f"_{version}"] = dict(applied=r["applied"], minimum_size=r["minimum_size"], per_step=per)
    any_r = next(iter(releases.values()))
    print(f"  {any_r['layers']} checkpointed layers (rank-{workloads.ZOO_RANK} residual MLP blocks), input "
          f"{'x'.join(map(str, any_r['shape']))} fp32 = {workloads.ZOO_SHAPE[0] * workloads.ZOO_SHAPE[1] * workloads.ZOO_SHAPE[2] * 4 / MiB:.0f} MiB "
          f"per layer; UnslothCheckpointFunction.apply(layer, True, h), h requires grad; {workloads.ZOO_STEPS} steps "
          f"per training run, {reps} runs per variant interleaved (A B B A ...) after one warm-up run each; torch threads "
          f"{any_r['threads']}")
    print("  upstream: HOTFIX_DISABLE=1 / hotfix.revert(); patched: hotfix active (patched* = only the "
          "closure-tensor wrapper applies there: the release's own offload runs)")
    print("  msg: times 'Unsloth: Will smartly offload gradients to save VRAM!' was printed in that step")
    print("\n".join(lines))
    out["target"] = "patched offloads from step 1; step time patched / upstream <= 1.05 where both offload the same"
    out["note"] = UNSLOTH_NOTE
    return out


