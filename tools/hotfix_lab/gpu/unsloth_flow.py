"""The seed's own flow on a GPU: unsloth's FastModel, Whisper, LoRA, use_gradient_checkpointing="unsloth".

    python -P -m hotfix_lab.gpu.unsloth_flow --site DIR [--transformers DIR] [--variants hotfix,upstream,...] [--jobs N]

DIR holds unsloth and unsloth_zoo 2026.10.9 and the pure-Python packages they
import that the GPU image lacks (datasets, dill, multiprocess, trl), installed
with ``pip install --target`` from the wheels of tools/hotfix_lab/gpu/unsloth-carry.txt;
hotfix is installed in the interpreter itself (its start-up hook must run, as
for a user).  ``--transformers DIR`` puts another transformers release first on
the path (the image's 5.17.0 otherwise, the newest unsloth 2026.10.9 accepts).
What the image lacks and does not travel (bitsandbytes, xformers, torchao, ...)
is optional to this flow, except one import of bitsandbytes: a stand-in takes
its place (unsloth_standins/README.md; the result names the stand-ins imported).

What runs, as the seed report does it (000 in the seeds): a random-weight
Whisper (tools/hotfix_lab/gpu/whisper_steps.py's ``test`` dims) and a Whisper processor (a
tiny tokenizer) saved with ``save_pretrained`` to a local folder; then, in a
fresh interpreter per variant, with ``HF_HUB_OFFLINE=1``: ``import unsloth``
first, ``FastModel.from_pretrained(<folder>, auto_model=WhisperForConditional
Generation, whisper_language="English", whisper_task="transcribe",
load_in_4bit=False, dtype=float32)``, ``FastModel.get_peft_model(r=64,
q_proj/v_proj, use_gradient_checkpointing="unsloth", ...)``, STEPS forward +
backward steps on unchanged weights, then the same step with checkpointing
switched off on the same model (the reference), twice (the run's noise floor).
One argument differs from the seed: ``init_lora_weights=False`` (random LoRA
B): PEFT's default B = 0 makes every lora_A gradient exactly zero in step 1,
and a zero compares equal to a zero however the step went wrong.

Deterministic (tools/hotfix_lab/gpu/equality.py's ``deterministic``: deterministic
algorithms warn_only, no TF32, math attention only, ``CUBLAS_WORKSPACE_CONFIG``),
set before unsloth loads and again after it has patched, and read back into
the result; gradients are judged by equality.py's rule (fp32 1e-6, widened only
by this run's noise floor: the step without checkpointing, repeated).
``UNSLOTH_OFFLOAD_FP32=exact``: unsloth-zoo 2026.10.9 otherwise stores
offloaded fp32 layer inputs as bf16.

Variants (VARIANTS): ``hotfix`` (installed, active), ``upstream``
(``HOTFIX_DISABLE=1``), and each ``-eager`` (``UNSLOTH_COMPILE_DISABLE=1``:
without unsloth's torch.compile of the model's modules, whose recomputed
forward is not bit-identical to the first; see COMPILED_TOLERANCE).  Each
prints one JSON line: status (ok / crash / timeout) and the stage a crash
happened in, per step whether every trainable gradient equals the reference
(hotfix.diagnostics.compare: a missing gradient never equals a zero one), the
largest relative error and the count of missing / unexpected gradients,
whether unsloth's "Will smartly offload gradients" line printed during step 1,
the step-1 and steady (steps 2..) peak of ``torch.cuda.max_memory_allocated``
and the reference step's, the losses, which checkpoint function the layers
call, the hotfix fixes applied and hotfix's own lines, which of unsloth's
requirements that did not travel it looked for, the stand-ins imported,
versions and settings.  A last line gives the verdict on the hotfix variants
(``verdict()``); the exit status is 1 when it names a problem.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor

from hotfix_lab.infra.paths import TOOLS

HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "unsloth_standins")  # README.md there: what each is and why
OFFLOAD_LINE = "Unsloth: Will smartly offload gradients to save VRAM!"
# batch 4: unsloth-zoo 2026.10.9 measures a layer input against its 2 MiB offload cutoff in the dtype it stores
# (fp32 as bf16 by default: 1500 x 256 x 2 B = 0.73 MiB a sample at test dims, so batch 2 never offloaded on the
# H100); batch 4 is over the cutoff whichever way fp32 is stored
DIMS, BATCH, STEPS = "test", 4, 3
LORA_RANK = 64  # the seed's r and lora_alpha
#: with unsloth's torch.compile'd modules the recomputed forward is not bit-identical to the first: measured on
#: an H100 (2026-11-25, batch 2) 2.1e-6 in 6 of 48 gradients (decoder lora_A), the same with and without
#: hotfix, while the step without checkpointing repeats exactly (noise floor 0) and the eager run is at 1.1e-7
COMPILED_TOLERANCE = 1e-5
#: hotfix-eager / upstream-eager: the same without unsloth's torch.compile of the model's modules
VARIANTS = {"hotfix": {}, "upstream": {"HOTFIX_DISABLE": "1"}, "hotfix-eager": {"UNSLOTH_COMPILE_DISABLE": "1"},
            "upstream-eager": {"HOTFIX_DISABLE": "1", "UNSLOTH_COMPILE_DISABLE": "1"}}
#: requirements of unsloth / unsloth_zoo 2026.10.9 that neither the image nor the carry holds (import names);
#: the result says which of them the flow looked for (all optional to it but bitsandbytes, which is stood in for)
NOT_CARRIED = ("xformers", "bitsandbytes", "torchao", "tyro", "diffusers", "hf_transfer", "msgspec",
               "cut_cross_entropy", "json5", "nest_asyncio", "structlog", "pydantic")
#: the language / task tokens WhisperTokenizer's prefix needs (whisper_language="English", whisper_task="transcribe")
SPECIAL_TOKENS = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>",
                  "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>")


# -- the checkpoint (a child without unsloth) ---------------------------------
def make_checkpoint(folder, dims=DIMS):
    """A random-weight Whisper and a Whisper processor, saved with save_pretrained, as a hub download would be."""
    import torch
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    steps = kit_module("whisper_steps")
    model, mels, _, _ = steps.build(types.SimpleNamespace(dims=dims, device="cpu", dtype="float32", lora=0), torch)
    model.save_pretrained(folder)
    # A byte-level BPE vocabulary without merges: enough for the processor to load with a language and task
    # (the labels are random ids; nothing is tokenized).  Language tokens follow <|startoftranscript|> in
    # LANGUAGES' order, which is how WhisperTokenizer finds a language's id.
    languages = [f"<|{code}|>" for code in LANGUAGES]
    tokens = [chr(c) for c in range(33, 127)] + ["<|endoftext|>", "<|startoftranscript|>"] + languages
    tokens += [t for t in SPECIAL_TOKENS if t not in tokens]
    vocab_file, merges_file = os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")
    with open(vocab_file, "w") as f:
        json.dump({token: index for index, token in enumerate(tokens)}, f)
    with open(merges_file, "w") as f:
        f.write("#version: 0.2\n")
    tokenizer = WhisperTokenizer(vocab_file=vocab_file, merges_file=merges_file, unk_token="<|endoftext|>",
                                 bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": tokens[tokens.index("<|startoftranscript|>"):]})
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=mels), tokenizer=tokenizer).save_pretrained(folder)


# -- one variant (a child) ------------------------------------------------------
class MissingImports:
    """A finder at the end of sys.meta_path: reached only when no other finder has the module, it records the
    name (of NOT_CARRIED) and finds nothing, so the import (or find_spec probe) fails exactly as without it."""

    def __init__(self):
        self.names = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname in NOT_CARRIED and fullname not in self.names:
            self.names.append(fullname)
        return None


def settings_in_effect(torch):
    """The deterministic settings as read back (tools/hotfix_lab/gpu/equality.py sets them; unsloth may change them)."""
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "tf32": bool(torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32),
        "flash_sdp": torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient_sdp": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn_sdp": getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: None)(),
        "math_sdp": torch.backends.cuda.math_sdp_enabled(),
        "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "offload_fp32": os.environ.get("UNSLOTH_OFFLOAD_FP32"),
    }


def kit_module(name):
    """A module of hotfix_lab.gpu (whisper_steps: the kit's model and batch builders; equality: its comparison
    rule and deterministic settings), imported at its first use (not at this module's import)."""
    import importlib

    return importlib.import_module(f"hotfix_lab.gpu.{name}")


def versions():
    from importlib.metadata import version

    found = {}
    for name in ("torch", "transformers", "peft", "accelerate", "unsloth", "unsloth_zoo", "trl", "datasets",
                 "hotfix-checkpoint"):
        try:
            found[name] = version(name)
        except Exception:
            found[name] = None
    import transformers  # the module's own version wins: --transformers may shadow the image's metadata

    found["transformers"] = transformers.__version__
    return found


def run_variant(folder, dims=DIMS, batch=BATCH):
    missing = MissingImports()
    sys.meta_path.append(missing)
    result = {"status": "crash", "stage": "import"}
    started = time.monotonic()
    try:
        _run_variant(folder, dims, batch, result)
        result["status"] = "ok"
        result.pop("stage")
    except Exception as exc:
        from hotfix.diagnostics.compare import short_error

        result["error"] = short_error(exc)
        import traceback

        traceback.print_exc()
    result["looked_for_not_carried"] = missing.names
    # vars(), not getattr(): a lazy module (transformers') would import what the attribute names
    result["standins_imported"] = sorted(name for name, module in list(sys.modules.items())
                                         if getattr(module, "__dict__", {}).get("STAND_IN") is True)
    result["seconds"] = round(time.monotonic() - started, 1)
    try:
        result["versions"] = versions()
        from hotfix.registry import registry

        result["applied"] = sorted(name for name, patch in registry.patches().items() if patch.applied)
    except Exception as exc:  # hotfix not importable here: say so in the line instead of losing it
        result["applied"] = f"unknown: {type(exc).__name__}: {exc}"
    print(json.dumps(result), flush=True)


def _run_variant(folder, dims, batch_size, result):
    import torch

    equality = kit_module("equality")
    equality.deterministic(torch)
    import unsloth  # noqa: F401  first, as unsloth asks (it patches transformers before it loads)
    from unsloth import FastModel
    from transformers import WhisperForConditionalGeneration

    result["stage"] = "from_pretrained"
    model, _processor = FastModel.from_pretrained(
        model_name=folder, dtype=torch.float32, load_in_4bit=False, auto_model=WhisperForConditionalGeneration,
        whisper_language="English", whisper_task="transcribe")
    result["stage"] = "get_peft_model"
    model = FastModel.get_peft_model(
        model, r=LORA_RANK, target_modules=["q_proj", "v_proj"], lora_alpha=LORA_RANK, lora_dropout=0, bias="none",
        use_gradient_checkpointing="unsloth", random_state=3407, use_rslora=False, loftq_config=None, task_type=None,
        init_lora_weights=False)
    equality.deterministic(torch)  # again: unsloth has patched by now
    result["settings"] = settings_in_effect(torch)
    result["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    result["model_dtype"] = str(next(model.parameters()).dtype).replace("torch.", "")
    result["trainable"] = sum(1 for p in model.parameters() if p.requires_grad)
    result["checkpointing"] = checkpointing_in_use(model, torch)

    from hotfix.diagnostics.compare import collect_grads

    steps = kit_module("whisper_steps")
    spec = dict(steps.DIMS[dims])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = steps.batch_of(batch_size, spec["num_mel_bins"], spec["frames"], spec["vocab_size"],
                           types.SimpleNamespace(device=device, dtype="float32"), torch)
    model.train()
    grads, losses, peaks, output = [], [], [], []
    for step in range(1, STEPS + 1):
        result["stage"] = f"step {step}"
        loss, peak, printed = _step(model, batch, torch)
        grads.append(collect_grads(model))
        losses.append(loss)
        peaks.append(peak)
        output.append(printed)
    result.update(losses=losses, offload_line_step1=OFFLOAD_LINE in output[0],
                  offload_line_count=sum(text.count(OFFLOAD_LINE) for text in output),
                  step1_peak_mib=_mib(peaks[0]),
                  steady_peak_mib=_mib(max((p for p in peaks[1:] if p is not None), default=None)))

    result["stage"] = "reference"
    switched = _checkpointing_off(model)
    loss, peak, _ = _step(model, batch, torch)
    reference = collect_grads(model)
    _step(model, batch, torch)  # the same step again: this run's noise floor (0.0 when fully deterministic)
    floor = equality.deviation(reference, collect_grads(model))
    bound = bound_for(os.environ.get("UNSLOTH_COMPILE_DISABLE") == "1", floor)
    result.update(reference_loss=loss, reference_peak_mib=_mib(peak), checkpointed_modules=switched,
                  noise_floor=floor, bound=bound)
    reports = [equality.judge(reference, got, bound) for got in grads]
    result.update(grads_equal=[r.ok for r in reports], max_rel_error=[r.max_error for r in reports],
                  grads_dropped=[len(r.missing) + len(r.unexpected) for r in reports],
                  grads=[r.summary() for r in reports])


def bound_for(eager, floor):
    """The largest relative error that counts as equal: hotfix_lab.gpu.equality's rule over this run's noise floor,
    and at least COMPILED_TOLERANCE where unsloth's compiled modules run (not eager)."""
    bound = kit_module("equality").allowed_error("float32", floor=floor)
    return bound if eager else max(bound, COMPILED_TOLERANCE)


def checkpointing_in_use(model, torch):
    """Which checkpoint each checkpointed layer calls (with its keywords), and what torch's and transformers'
    module-level checkpoint names hold after unsloth has patched: which path (reentrant or not, unsloth's
    offloading function or torch's) this flow really takes."""
    import torch.utils.checkpoint as tuc

    layers = {}
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            key = _describe(getattr(module, "_gradient_checkpointing_func", None))
            layers[key] = layers.get(key, 0) + 1
    hf = sys.modules.get("transformers.modeling_utils")
    return {"layers": layers, "torch.utils.checkpoint.checkpoint": _describe(tuc.checkpoint),
            "torch.utils.checkpoint.CheckpointFunction": _describe(tuc.CheckpointFunction),
            "transformers.modeling_utils.checkpoint": _describe(getattr(hf, "checkpoint", None))}


def _describe(function, depth=0):
    import functools

    if function is None:
        return "none"
    if isinstance(function, functools.partial) and depth < 3:
        keywords = ", ".join(f"{k}={v!r}" for k, v in sorted(function.keywords.items()))
        return f"partial({_describe(function.func, depth + 1)}{', ' + keywords if keywords else ''})"
    wrapped = getattr(function, "__wrapped__", None)  # a wrapt / functools.wraps wrapper: name what it wraps too
    own = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', type(function).__name__)}"
    return own if wrapped is None or depth >= 3 else f"{own} -> {_describe(wrapped, depth + 1)}"


def _step(model, batch, torch):
    """One forward + backward from cleared gradients: (loss, peak allocated bytes or None, what it printed)."""
    model.zero_grad(set_to_none=True)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            loss = model(**batch).loss
            loss.backward()
        if cuda:
            torch.cuda.synchronize()
    finally:
        sys.stderr.write(printed.getvalue())
    return float(loss.detach()), (torch.cuda.max_memory_allocated() if cuda else None), printed.getvalue()


def _checkpointing_off(model):
    """What transformers' gradient_checkpointing_disable() sets (each layer's flag), and nothing else: the
    input-grad hook PEFT's flow installed stays, so the reference differs only in not checkpointing."""
    switched = 0
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            module.gradient_checkpointing = False
            switched += 1
    if not switched:
        raise RuntimeError("no module had gradient checkpointing on: nothing to compare")
    return switched


def _mib(value):
    return None if value is None else round(value / 2**20, 1)


# -- the verdict ---------------------------------------------------------------
def verdict(rows):
    """What is wrong with the flow under hotfix, one line each (empty: nothing).  Every hotfix variant that
    ran must train, print unsloth's offload line once and in step 1, lose no gradient and gain none, and
    match the step without checkpointing (tools/hotfix_lab/gpu/equality.py's bound from this run's noise floor; at least
    COMPILED_TOLERANCE with unsloth's compiled modules).
    Upstream rows are reported, never judged: whether upstream is broken depends on the release."""
    problems = []
    hotfix_rows = [row for row in rows if str(row.get("variant", "")).startswith("hotfix")]
    if not hotfix_rows:
        problems.append("no hotfix variant ran")
    for row in hotfix_rows:
        name = row["variant"]
        if row.get("status") != "ok":
            problems.append(f"{name}: {row.get('status')} at {row.get('stage')}: {row.get('error')}")
            continue
        if not row.get("offload_line_step1") or row.get("offload_line_count") != 1:
            problems.append(f"{name}: unsloth's offload line printed {row.get('offload_line_count')} times, "
                            f"{'' if row.get('offload_line_step1') else 'not '}in step 1")
        bound = bound_for(name.endswith("-eager"), row.get("noise_floor"))
        for step, (dropped, error, summary) in enumerate(zip(row["grads_dropped"], row["max_rel_error"],
                                                             row["grads"]), 1):
            if dropped or error > bound:
                problems.append(f"{name}: step {step}: {summary} (tolerance {bound:.0e})")
        foreign = [module for module in row.get("standins_imported", []) if module.split(".")[0] != "bitsandbytes"]
        if foreign:
            problems.append(f"{name}: unexpected stand-ins imported: {foreign}")
    return problems


# -- the driver -------------------------------------------------------------------
def standins_needed(site):
    """The stand-ins go on the path only where the real package is in neither the carry nor the interpreter."""
    import importlib.util

    return bool(site) and not (os.path.isdir(os.path.join(site, "bitsandbytes"))
                               or importlib.util.find_spec("bitsandbytes"))


def child_env(site, transformers_dir, workdir, extra, name="checkpoint"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTFIX_") and k != "PYTHONPATH"}
    path = (transformers_dir, site, STANDINS if standins_needed(site) else "", str(TOOLS))  # TOOLS: this module
    # UNSLOTH_OFFLOAD_FP32=exact: unsloth-zoo 2026.10.9 otherwise stores offloaded fp32 layer inputs as bf16
    # (its default, lossy by design), and the recomputed layer would start from rounded inputs.
    # A compile cache per variant: variants may run at the same time (--jobs), and none reuses another's modules.
    env.update(HF_HUB_OFFLINE="1", CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1", UNSLOTH_OFFLOAD_FP32="exact",
               UNSLOTH_COMPILE_LOCATION=os.path.join(workdir, f"unsloth_compiled_cache-{name}"),
               PYTHONPATH=os.pathsep.join(p for p in path if p))
    env.update(extra)
    return env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--site", help="folder holding unsloth, unsloth_zoo and their carried requirements")
    p.add_argument("--transformers", default="", help="folder holding another transformers release (first on the path)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    p.add_argument("--timeout", type=float, default=150, help="seconds per variant")
    p.add_argument("--jobs", type=int, default=1,
                   help="variants at once (each its own interpreter; peaks are per process, timings then not claims)")
    p.add_argument("--dims", default=DIMS, help="tools/hotfix_lab/gpu/whisper_steps.py's DIMS (tiny-cpu: the CPU self-test)")
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--make-checkpoint", metavar="FOLDER", help=argparse.SUPPRESS)
    p.add_argument("--run", metavar="FOLDER", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.make_checkpoint:
        return make_checkpoint(args.make_checkpoint, args.dims)
    if args.run:
        return run_variant(args.run, args.dims, args.batch)
    if not args.site or not os.path.isdir(os.path.join(args.site, "unsloth")):
        p.error(f"--site {args.site!r} holds no unsloth")
    unknown = [name for name in args.variants.split(",") if name not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    site, transformers_dir = os.path.abspath(args.site), os.path.abspath(args.transformers) if args.transformers else ""
    with tempfile.TemporaryDirectory(prefix="unsloth-flow-") as workdir:  # outside the checkout: no shadowing
        folder = os.path.join(workdir, "whisper-random")
        made = subprocess.run([sys.executable, "-P", "-m", __spec__.name, "--make-checkpoint", folder, "--dims", args.dims],
                              env=child_env("", transformers_dir, workdir, {"HOTFIX_DISABLE": "1"}), cwd=workdir,
                              capture_output=True, text=True, timeout=300)
        if made.returncode:
            sys.stderr.write(made.stderr[-3000:])
            print(json.dumps({"status": "crash", "stage": "make-checkpoint", "error": made.stderr.strip()[-300:]}))
            return 1
        def one(name):
            return run_one(name, site, transformers_dir, workdir, folder, args)

        rows = []
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:  # rows in the order asked for
            for row, chatter, stderr in pool.map(one, args.variants.split(",")):
                name = row["variant"]
                sys.stderr.write(f"---- {name}: stdout\n{chatter[-4000:]}\n---- {name}: stderr (last 4000 characters)"
                                 f"\n{stderr[-4000:]}\n")
                print(json.dumps(row), flush=True)
                rows.append(row)
    problems = verdict(rows)
    print(json.dumps({"verdict": "ok" if not problems else "wrong", "problems": problems}), flush=True)
    return 1 if problems else 0


def run_one(name, site, transformers_dir, workdir, folder, args):
    """One variant in its own interpreter: (result row, its stdout chatter, its stderr)."""
    env = child_env(site, transformers_dir, workdir, VARIANTS[name], name)
    try:
        proc = subprocess.run([sys.executable, "-P", "-m", __spec__.name, "--run", folder, "--dims", args.dims,
                               "--batch", str(args.batch)], env=env,
                              cwd=workdir, capture_output=True, text=True, timeout=args.timeout)
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        stdout, stderr = "", _text(exc.stderr)
        proc = None
    chatter = "\n".join(line for line in stdout.splitlines() if not line.startswith("{"))
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    row = lines[-1] if lines else {"status": "timeout" if proc is None else "crash",
                                   "error": f"no result line (exit status {None if proc is None else proc.returncode})"}
    row = dict(variant=name, **row)
    row["hotfix_lines"] = [line for line in stderr.splitlines() if line.startswith("hotfix")][:10]
    row["transformers_dir"] = transformers_dir or None
    return row, chatter, stderr


def _text(data):
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


if __name__ == "__main__":
    sys.exit(main())
