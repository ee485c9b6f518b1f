"""unsloth's offload under the non-reentrant default, on CUDA: the GPU kit's case for unsloth-zoo-nonreentrant-offload.

    python -P -m hotfix_lab.gpu.nonreentrant --zoo 2025.11.5=DIR --zoo 2026.10.9=DIR --transformers5 DIR \
        --out FILE [--device cuda] [--jobs 5]          every variant, each in its own interpreter
    python -P -m hotfix_lab.gpu.nonreentrant ... --dry-run    the children's commands, and what they need
    python -P -m hotfix_lab.gpu.nonreentrant --child --zoo-dir DIR --setup default   one variant (HOTFIX_DISABLE=1: upstream)

What docs/fixes/unsloth-zoo-nonreentrant-offload.md measured on CPU (tools/hotfix_lab/cases/zoo_routing.py),
with the release's real CUDA layer: transformers 5.x's ``gradient_checkpointing_enable()``
stores ``use_reentrant=False`` (``default``), TRL passes ``{"use_reentrant": False}`` (``trl``),
and on unsloth-zoo 2025.1.1 - 2026.3.2 torch's non-reentrant checkpoint then runs instead of
unsloth's offloading function: nothing is offloaded.  The order of a real run: transformers
(the kit's 5.23.0 first on PYTHONPATH) imported (hotfix activates there unless
HOTFIX_DISABLE=1), the release loaded (tools/hotfix_lab/infra/zoo_loader.py), its own
``patch_unsloth_smart_gradient_checkpointing(dtype=float32)`` called (what
``use_gradient_checkpointing="unsloth"`` does: its pinned buffers and streams), then
checkpointing enabled on the model.  ``reentrant`` forces ``{"use_reentrant": True}``: upstream's
own offload, what the routed call should match.

Model: a Llama whose decoder-layer inputs exceed unsloth's 2 MiB cutoff in every release's unit
(DIMS["gpu"]: 16 x 512 x 1024 fp32 = 32 MiB, 16 MiB counted as bf16), every parameter trained,
fp32, tools/hotfix_lab/gpu/equality.py's deterministic kernels.  Per variant, before unsloth's swap: the
reference step without checkpointing (its peak) and the same step again (the noise floor); then
STEPS steps on unchanged weights, each: the ``UnslothCheckpointFunctionBackward`` nodes the loss
hangs on per checkpointed layer (1.0: unsloth's function ran for every layer), whether unsloth's
"Will smartly offload" line printed, the peak of ``torch.cuda.max_memory_allocated`` (reset before
the step), and every gradient against the reference by equality.py's rule (a missing gradient is
never equal).  One JSON line per variant; the driver adds the hotfix lines the child printed.

Variants per release (VARIANTS): upstream ``default`` / ``trl`` (bypassed on 2025.11.5), hotfix
``default`` / ``trl`` (routed back), upstream ``reentrant``.  2026.10.9 is the control: upstream
already runs unsloth's function there (it forces use_reentrant=True itself).  fp32 is asserted
exact, so UNSLOTH_OFFLOAD_FP32=exact (read by 2026.9.8 and later; the row says what the release
read).  ``verdict()`` names what is not as expected; tools/hotfix_lab/gpu/report.py prints the rows, the
peak ratios and the verdict.

``--device cpu`` (the kit's CPU self-test): the tiny Llama of tools/hotfix_lab/cases/zoo_routing.py on its CPU
seam (upstream's offload through fake streams, hotfix's on the simulated device); no memory figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from hotfix_lab.infra.paths import TOOLS

STEPS = 3
#: Llama sizes; "gpu": decoder-layer inputs of batch x seq x hidden = 16 x 512 x 1024 fp32 (32 MiB) each, over
#: the 2 MiB cutoff in every unit a release counts it in, and 12 of them, so keeping or offloading them shows
#: in the peak beside 84 M parameters; "tiny-cpu": zoo_routing.py's tiny Llama (its CPU seam's thresholds)
DIMS = {
    "gpu": dict(vocab_size=1000, hidden_size=1024, intermediate_size=1024, num_hidden_layers=12,
                num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512, batch=16, seq=512),
    "tiny-cpu": dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, batch=2, seq=16),
}
#: (name, hotfix on, setup); setups as tools/hotfix_lab/cases/zoo_routing.py's ENABLE_KWARGS
VARIANTS = (("upstream:default", False, "default"), ("upstream:trl", False, "trl"),
            ("hotfix:default", True, "default"), ("hotfix:trl", True, "trl"),
            ("upstream:reentrant", False, "reentrant"))
FIXED_UPSTREAM = "2026.3.3"  # from here on upstream's unsloth_checkpoint forces use_reentrant=True
FIX = "unsloth-zoo-nonreentrant-offload"


# -- one variant (a child) -------------------------------------------------------
def child(zoo_dir, setup, device, dims, steps, offload_fp32):
    sys.path.insert(0, zoo_dir)  # the release measured, first (zoo_loader loads it from sys.path)
    active = os.environ.get("HOTFIX_DISABLE") != "1"
    if active:
        import hotfix  # noqa: F401  (the start-up hook's moment: before transformers, as installed)
    import torch
    import transformers

    from hotfix_lab.gpu import equality

    equality.deterministic(torch)
    row = {"setup": setup, "hotfix": active, "device": device, "dims": dims, "transformers": transformers.__version__,
           "torch": torch.__version__, "status": "crash", "stage": "build"}
    try:
        _measure(row, setup, device, dims, steps, offload_fp32, torch)
        row["status"] = "ok"
        row.pop("stage")
    except Exception as exc:
        from hotfix.diagnostics.compare import short_error

        row["error"] = short_error(exc)
        import traceback

        traceback.print_exc()
    if active:
        from hotfix.registry import registry

        row["applied"] = sorted(name for name, patch in registry.patches().items() if patch.applied)
    print(json.dumps(row), flush=True)


def _measure(row, setup, device, dims, steps, offload_fp32, torch):
    from hotfix_lab.gpu import equality
    from hotfix_lab.gpu import whisper_steps  # offload_fp32_read: how the release stores offloaded fp32 inputs
    from hotfix_lab.infra import zoo_loader
    from hotfix_lab.cases import zoo_routing

    cuda = device == "cuda"
    model, batch = build(dims, device, torch)
    layers = DIMS[dims]["num_hidden_layers"]
    row["stage"] = "reference"
    reference, row["reference_peak"] = _step(model, batch, torch, cuda)[1:3]
    floor = equality.deviation(reference, _step(model, batch, torch, cuda)[1])
    bound = equality.allowed_error("float32", floor=floor)
    row.update(noise_floor=floor, bound=bound, layers=layers)

    row["stage"] = "unsloth"
    if offload_fp32:
        os.environ["UNSLOTH_OFFLOAD_FP32"] = offload_fp32
    gc = zoo_loader.load_release()
    from importlib import metadata

    row["unsloth_zoo"] = metadata.version("unsloth-zoo")
    offloader = None
    if cuda:
        gc.patch_unsloth_smart_gradient_checkpointing(dtype=torch.float32)  # its own pinned buffers and streams
    else:  # zoo_routing's CPU seam: fake streams upstream, the simulated device for hotfix's offloader
        zoo_routing.request_unsloth_offload(gc)
        zoo_loader.cpu_initialize(gc, minimum_size=zoo_routing.UPSTREAM_MINIMUM_SIZE)
        offloader = zoo_routing._offloader()
    row["offload_fp32"] = whisper_steps.offload_fp32_read(gc)
    if offloader is None and "hotfix" in sys.modules:
        from hotfix.registry import registry

        patch = registry.patches().get("unsloth-zoo-offload-backward")
        offloader = patch.offloader if patch is not None and patch.applied else None

    row["stage"] = "enable"
    kwargs = zoo_routing.ENABLE_KWARGS[setup]
    model.gradient_checkpointing_enable(**({} if kwargs is None else {"gradient_checkpointing_kwargs": kwargs}))
    rows = []
    for step in range(1, steps + 1):
        row["stage"] = f"step {step}"
        printed, grads, peak, nodes = _step(model, batch, torch, cuda, count=zoo_routing.NODE)
        report = equality.judge(reference, grads, bound)
        found = {"unsloth_nodes_per_layer": nodes / layers, "offload_line": zoo_routing.OFFLOAD_LINE in printed,
                 "peak": peak, "grads_equal": report.ok, "max_rel_error": report.max_error,
                 "missing": len(report.missing) + len(report.unexpected)}
        if offloader is not None:  # hotfix's own offloader (releases before 2026.8.11): what it sent to the host
            found["offloaded_by_hotfix"] = len(offloader.stats.offloaded.get(step, []))
        rows.append(found)
    steady = [r["peak"] for r in rows[1:] if r["peak"] is not None]
    row.update(steps=rows, offload_line_step1=rows[0]["offload_line"],
               offload_lines=sum(r["offload_line"] for r in rows), step1_peak=rows[0]["peak"],
               steady_peak=max(steady) if steady else None)


def build(dims, device, torch):
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = dict(DIMS[dims])
    batch, seq = sizes.pop("batch"), sizes.pop("seq")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**sizes)).train()
    ids = torch.randint(3, sizes["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    return model, {"input_ids": ids, "labels": ids.clone()}


def _step(model, batch, torch, cuda, count=None):
    """One forward + backward from cleared gradients: (stdout printed, gradients, peak bytes or None, nodes
    named ``count`` the loss hangs on)."""
    from hotfix.diagnostics.compare import collect_grads

    from hotfix_lab.cases import zoo_routing

    model.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        loss = model(**batch).loss
        nodes = zoo_routing.count_nodes(loss, count) if count else None
        loss.backward()
    if cuda:
        torch.cuda.synchronize()
    sys.stderr.write(out.getvalue())
    return out.getvalue(), collect_grads(model), (torch.cuda.max_memory_allocated() if cuda else None), nodes


# -- the verdict -------------------------------------------------------------------
def _older(version, than):
    from packaging.version import Version

    return Version(version) < Version(than)


def expectation(release, name):
    """(unsloth's function on every layer, offload line in step 1) expected for a variant on a release."""
    hotfix, setup = name.split(":")
    bypassed = setup != "reentrant" and hotfix == "upstream" and _older(release, FIXED_UPSTREAM)
    return (not bypassed, not bypassed)


def verdict(rows):
    """What is not as expected, one line each (empty: everything).  Every variant must train with every gradient
    equal to the step without checkpointing; unsloth's function runs on every layer of every step (and the offload
    line prints in step 1) except upstream's non-reentrant calls on releases before FIXED_UPSTREAM, where it must
    be bypassed (no node, no line): that is the defect the case shows.  hotfix's "repaired" line naming the fix
    prints exactly where it routed a call (hotfix variants before FIXED_UPSTREAM)."""
    problems = []
    for row in rows:
        name, release = row.get("variant"), row.get("release")
        label = f"{release} {name}"
        if row.get("status") != "ok":
            problems.append(f"{label}: {row.get('status')} at {row.get('stage')}: {row.get('error')}")
            continue
        runs, line = expectation(release, name)
        per_layer = [step["unsloth_nodes_per_layer"] for step in row["steps"]]
        if runs and any(value != 1.0 for value in per_layer):
            problems.append(f"{label}: unsloth's function ran on {per_layer} of the layers per step, expected all")
        if not runs and any(per_layer):
            problems.append(f"{label}: unsloth's function ran ({per_layer} per layer) where it is bypassed upstream")
        if line != bool(row.get("offload_line_step1")):
            problems.append(f"{label}: offload line in step 1 {row.get('offload_line_step1')}, expected {line}")
        for number, step in enumerate(row["steps"], 1):
            if not step["grads_equal"]:
                problems.append(f"{label}: step {number}: gradients not equal (max rel. {step['max_rel_error']:.3g}, "
                                f"bound {row.get('bound'):.3g}, {step['missing']} missing or unexpected)")
        said = any(FIX in line for line in row.get("hotfix_lines", []))
        if said != (name.startswith("hotfix:") and _older(release, FIXED_UPSTREAM)):
            problems.append(f"{label}: hotfix's {FIX} line {'printed' if said else 'not printed'}")
        if row.get("offload_fp32") == "bf16":
            problems.append(f"{label}: the release stored offloaded fp32 inputs as bf16 (UNSLOTH_OFFLOAD_FP32 unset)")
    return problems


def peak_ratios(rows):
    """Per release: steady-state (steps 2..) peak of hotfix:default and hotfix:trl over upstream's bypassed call
    (the same setup) and over upstream:reentrant (the offload as upstream does it); None where a figure is missing."""
    out = {}
    for release in sorted({row.get("release") for row in rows}):
        peaks = {row["variant"]: row.get("steady_peak") for row in rows
                 if row.get("release") == release and row.get("status") == "ok"}
        for setup in ("default", "trl"):
            mine = peaks.get(f"hotfix:{setup}")
            for theirs in (f"upstream:{setup}", "upstream:reentrant"):
                other = peaks.get(theirs)
                out[f"{release} hotfix:{setup} / {theirs}"] = (None if mine is None or not other else mine / other)
    return out


# -- the driver --------------------------------------------------------------------
def commands(args):
    """(release, variant, command, environment) of every child."""
    found = []
    for spec in args.zoo:
        release, _, folder = spec.partition("=")
        for name, hotfix, setup in VARIANTS:
            env = {k: v for k, v in os.environ.items() if not k.startswith("HOTFIX_") and k != "PYTHONPATH"}
            env["PYTHONPATH"] = os.pathsep.join(([args.transformers5] if args.transformers5 else []) + [str(TOOLS)])
            if not hotfix:
                env["HOTFIX_DISABLE"] = "1"
            env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
            cmd = [sys.executable, "-P", "-m", __spec__.name, "--child", "--zoo-dir", folder, "--setup", setup,
                   "--device", args.device, "--dims", args.dims, "--steps", str(args.steps), "--offload-fp32", "exact"]
            found.append((release, name, cmd, env))
    return found


def run_child(release, name, cmd, env, timeout):
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(TOOLS))
        stdout, stderr, status = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, status = "", exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else "", None
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    row = lines[-1] if lines else {"status": "timeout" if status is None else "crash",
                                   "error": f"no result line (exit status {status})"}
    row = dict(release=release, variant=name, **row)
    row["hotfix_lines"] = [line for line in stderr.splitlines() if line.startswith("hotfix")][:10]
    row["seconds"] = round(time.monotonic() - started, 1)
    return row, stderr


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zoo", action="append", default=[], help="VERSION=DIR of an unsloth-zoo release (--target folder)")
    p.add_argument("--transformers5", default="", help="folder holding transformers 5.x (first on the children's path)")
    p.add_argument("--out", help="JSON lines file: one row per variant, then the verdict")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dims", choices=sorted(DIMS), default="gpu")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--jobs", type=int, default=5)
    p.add_argument("--timeout", type=float, default=150, help="seconds per child")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--zoo-dir", help=argparse.SUPPRESS)
    p.add_argument("--setup", choices=("default", "trl", "reentrant"), help=argparse.SUPPRESS)
    p.add_argument("--offload-fp32", choices=("exact", "bf16"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.zoo_dir, args.setup, args.device, args.dims, args.steps, args.offload_fp32) or 0
    missing = [spec for spec in args.zoo if not os.path.isfile(os.path.join(spec.partition("=")[2], "unsloth_zoo",
                                                                              "gradient_checkpointing.py"))]
    if args.transformers5 and not os.path.isfile(os.path.join(args.transformers5, "transformers", "__init__.py")):
        missing.append(f"transformers in {args.transformers5}")
    if not args.zoo or missing:
        p.error(f"missing: {missing or 'no --zoo given'}")
    children = commands(args)
    if args.dry_run:
        for release, name, cmd, env in children:
            print(f"nonreentrant {release} {name}: {'HOTFIX_DISABLE=1 ' if 'HOTFIX_DISABLE' in env else ''}"
                  f"PYTHONPATH={env.get('PYTHONPATH', '')} {' '.join(cmd[1:])}")
        return 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(lambda c: run_child(*c[:3], c[3], args.timeout), children))
    rows = []
    for row, stderr in done:
        sys.stderr.write(f"---- {row['release']} {row['variant']} (last 3000 characters of stderr)\n{stderr[-3000:]}\n")
        rows.append(row)
    problems = verdict(rows)
    text = "\n".join(json.dumps(row) for row in rows) + "\n" + json.dumps(
        {"verdict": "as expected" if not problems else "not as expected", "problems": problems}) + "\n"
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
