#!/usr/bin/env python3
"""Sweep transformers' own models through ``hotfix.checker``, with and without hotfix.

    python tools/sweep_models.py                      # full sweep: 4.56.2 and 5.23.0, every model type
    python tools/sweep_models.py --fast               # the CI subset (tests/test_sweep_fast.py)
    python tools/sweep_models.py --versions 4.56.2 --models bert,whisper
    python tools/sweep_models.py --render-only        # rebuild docs/sweep.md from the results file

For every transformers release asked for (installed side by side in
``.matrix/transformers-<v>`` by scripts/test.sh) and for hotfix off
(``HOTFIX_DISABLE=1``) and on, a worker interpreter with that release first on
PYTHONPATH takes every model type of ``MODEL_MAPPING_NAMES`` (the base model
class, one per type), keeps those whose class ``supports_gradient_checkpointing``,
builds it on CPU from its config class's defaults shrunk to a tiny size
(:func:`shrink_config`), makes a dummy batch from ``main_input_name`` and the
forward signature (:func:`dummy_batch`), and runs
``hotfix.checker.check_model`` with the reentrant and non-reentrant modes (the
loss is a fixed random projection of the first float output).  Models that
cannot be built or run are listed as such.  Each worker is bounded per model
(``--model-timeout``) and by the checker's memory and time guards; a model that
kills or hangs its worker is recorded and the worker restarted after it.

Results go to ``--results`` (JSON lines; an interrupted sweep resumes where it
stopped) and the table to ``--doc`` (docs/sweep.md).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import inspect
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / ".matrix"
DEFAULT_VERSIONS = ["4.56.2", "5.23.0"]
FAST_VERSIONS = ["4.56.2"]
# The CI subset: two models hotfix fixes, two that were never broken.
FAST_MODELS = ["bert", "layoutlm", "deberta-v2", "whisper"]
SWEEP_MODES = ("reentrant", "non-reentrant")

# Failures that remain with hotfix, and why they are outside hotfix's class
# (tensors needing grad that reach a checkpointed layer other than as
# positional inputs, or checkpointed layers none of whose inputs need grad).
# Filled from the sweep's results; see docs/sweep.md.
# Shown only where the model still fails with hotfix.
OUT_OF_SCOPE: Dict[str, str] = {
    "data2vec-audio": "rounding, not gradient loss: 2-3 conv feature-extractor weights differ by 1.1e-6 relative "
    "(tolerance 1e-6) under reentrant recomputation, with and without hotfix; no gradient is missing",
    "mt5": "rounding, not gradient loss: 4 weights (relative_attention_bias, q, 2 layer norms) differ by "
    "1.0e-6 to 1.2e-6 relative (tolerance 1e-6) under reentrant recomputation, with and without hotfix; "
    "in float64 all 51 gradients agree to 1.8e-15; no gradient is missing",
    "wav2vec2-conformer": "rounding, not gradient loss: 5 feature-extractor parameters (3 conv weights, one layer norm's weight and bias) differ by 1.0e-6 to "
    "1.4e-6 relative (tolerance 1e-6) under reentrant recomputation, with and without hotfix; in float64 all "
    "86 gradients agree to 2.4e-15; no gradient is missing",
    "wavlm": "hotfix removes the unpatched failure (position_bias= by keyword, history re-walked per layer: "
    "memory guard); what remains is rounding: feature_extractor.conv_layers.0.conv.weight differs by 1.02e-6 "
    "relative (tolerance 1e-6); in float64 all 57 gradients agree to 1.7e-15; no gradient is missing",
    "pvt_v2": "the layer's output, not its inputs: PvtV2EncoderLayer (a whole stage) returns "
    "((hidden_states,), height, width), and reentrant checkpointing (an autograd.Function) connects only "
    "top-level output tensors to the graph, so the nested hidden states leave every stage detached and no "
    "parameter gets a gradient, with and without hotfix; non-reentrant checkpointing passes",
}


# ---------------------------------------------------------------------------
# worker side: runs inside the interpreter with the release under test
# ---------------------------------------------------------------------------
SMALL = {
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "dim": 32, "hidden_dim": 64,
    "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2, "n_layers": 2, "encoder_layers": 2,
    "decoder_layers": 2, "num_decoder_layers": 2, "num_encoder_layers": 2,
    "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "num_heads": 2, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "num_key_value_heads": 2, "num_kv_heads": 2,
    "intermediate_size": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "ffn_dim": 64, "d_ff": 64,
    "n_inner": 64, "d_kv": 16, "head_dim": 16, "attention_head_size": 16,
    "vocab_size": 128, "max_position_embeddings": 64, "n_positions": 64,
    "num_experts": 2, "num_local_experts": 2, "n_routed_experts": 2, "num_experts_per_tok": 1,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "kv_lora_rank": 16,
    "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "image_size": 32, "patch_size": 8, "num_mel_bins": 8, "max_source_positions": 16,
    "max_target_positions": 32,
}
_LIST_LAYER_ATTRS = ("depths", "hidden_sizes", "num_heads", "embed_dims")


def shrink_config(config, depth: int = 0):
    """Set the usual size fields of a config (and its sub-configs) small; dropout off."""
    from transformers import PretrainedConfig

    for key, value in list(vars(config).items()):
        if isinstance(value, PretrainedConfig) and depth < 3:
            shrink_config(value, depth + 1)
        elif key in SMALL and isinstance(value, int) and not isinstance(value, bool):
            setattr(config, key, min(value, SMALL[key]) if key != "hidden_dim" else min(value, SMALL[key]))
        elif isinstance(value, float) and ("dropout" in key or key in ("layerdrop", "mask_time_prob",
                                                                      "mask_feature_prob", "drop_path_rate")):
            setattr(config, key, 0.0)
    if getattr(config, "num_key_value_heads", None) and getattr(config, "num_attention_heads", None):
        config.num_key_value_heads = min(config.num_key_value_heads, config.num_attention_heads)
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int):
        for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                    "cls_token_id", "mask_token_id", "unk_token_id"):
            tid = getattr(config, key, None)
            if isinstance(tid, int) and tid >= vocab:
                setattr(config, key, 1)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    return config


def _sub(config, *names):
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None:
            return sub
    return config


def dummy_batch(model, config, seed: int = 0) -> Dict:
    """A batch for ``model`` from its main_input_name and forward signature."""
    import torch

    g = torch.Generator().manual_seed(seed)
    params = inspect.signature(model.forward).parameters
    name = getattr(model, "main_input_name", "input_ids")
    batch: Dict = {}
    text = _sub(config, "text_config", "decoder")
    vocab = getattr(config, "vocab_size", None) or getattr(text, "vocab_size", None) or 100
    if name == "input_ids":
        batch["input_ids"] = torch.randint(3, min(vocab, 100), (2, 8), generator=g)
    elif name == "pixel_values":
        vision = _sub(config, "vision_config", "backbone_config")
        size = getattr(vision, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        channels = getattr(vision, "num_channels", 3)
        batch["pixel_values"] = torch.randn(2, channels, size, size, generator=g)
    elif name == "input_values":
        batch["input_values"] = torch.randn(2, 1600, generator=g)
    elif name == "input_features":
        if getattr(config, "num_mel_bins", None) and getattr(config, "max_source_positions", None):
            batch["input_features"] = torch.randn(2, config.num_mel_bins, 2 * config.max_source_positions, generator=g)
        else:
            feat = getattr(config, "input_feat_per_channel", None) or getattr(config, "feature_size", None) or 80
            chans = getattr(config, "input_channels", 1)
            batch["input_features"] = torch.randn(2, 16, feat * chans, generator=g)
    else:
        raise ValueError(f"no dummy input for main_input_name={name!r}")
    # two-tower / multimodal models (CLIP-like): both inputs
    if "pixel_values" in params and "pixel_values" not in batch and getattr(config, "vision_config", None) is not None:
        vision = config.vision_config
        size = getattr(vision, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        batch["pixel_values"] = torch.randn(2, getattr(vision, "num_channels", 3), size, size, generator=g)
    if "input_ids" in params and "input_ids" not in batch and getattr(config, "text_config", None) is not None:
        batch["input_ids"] = torch.randint(3, min(vocab, 100), (2, 8), generator=g)
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        batch["decoder_input_ids"] = torch.randint(3, min(vocab, 100), (2, 6), generator=g)
    if "bbox" in params:
        x0 = torch.randint(0, 30, (2, 8, 1), generator=g)
        y0 = torch.randint(0, 30, (2, 8, 1), generator=g)
        batch["bbox"] = torch.cat([x0, y0, x0 + 5, y0 + 5], dim=-1)
    return batch


def _model_types(only: Optional[List[str]]):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    for model_type, class_name in MODEL_MAPPING_NAMES.items():
        if only and model_type not in only:
            continue
        if isinstance(class_name, (list, tuple)):
            class_name = class_name[0]
        yield model_type, class_name, CONFIG_MAPPING_NAMES.get(model_type)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:160]}"


def check_one(model_type: str, class_name: str, config_name: Optional[str], memory_limit: int, time_limit: float):
    import warnings

    import torch
    import transformers

    from hotfix.checker import check_model

    row = {"model_type": model_type, "class": class_name}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = getattr(transformers, class_name)
            if not getattr(cls, "supports_gradient_checkpointing", False):
                row.update(result="no-checkpointing", detail="supports_gradient_checkpointing is False")
                return row
            config = shrink_config(getattr(transformers, config_name)())
            torch.manual_seed(0)
            model = cls(config).train()
            batch = dummy_batch(model, config)
    except BaseException as exc:  # some modules raise ImportError/SystemExit for missing extras
        row.update(result="could-not-build", detail=_short(exc))
        return row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = check_model(model, batch, modes=SWEEP_MODES, memory_limit=memory_limit, time_limit=time_limit,
                             hard_exit=True, grace=30)
    row["parameters"] = len(report.parameters)
    if report.reference.status != "reference":
        row.update(result="could-not-run", detail=report.reference.error)
        return row
    if not report.supported:
        row.update(result="no-checkpointing", detail=report.modes[0].error if report.modes else "")
        return row
    row["modes"] = {m.mode: {"status": m.status, "summary": m.summary(), "missing": len(m.missing),
                             "wrong": len(m.wrong), "total": m.total, "saved_bytes": m.saved_bytes}
                    for m in report.modes}
    row["result"] = "pass" if report.safe else "FAIL"
    return row


def worker_main(args) -> int:
    import torch

    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    from hotfix.registry import registry

    only = args.models.split(",") if args.models else None
    skip = set(args.skip.split(",")) if args.skip else set()
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "hotfix": registry.active}
    for model_type, class_name, config_name in _model_types(only):
        if model_type in skip:
            continue
        print(json.dumps({"start": model_type}), flush=True)
        if config_name is None:
            row = {"model_type": model_type, "class": class_name, "result": "could-not-build", "detail": "no config"}
        else:
            try:
                row = check_one(model_type, class_name, config_name, args.memory_limit, args.time_limit)
            except BaseException as exc:
                row = {"model_type": model_type, "class": class_name, "result": "could-not-run", "detail": _short(exc)}
        row.update(meta)
        print(json.dumps({"row": row}), flush=True)
    print(json.dumps({"done": True}), flush=True)
    return 0


# ---------------------------------------------------------------------------
# driver side
# ---------------------------------------------------------------------------
def _reader(stream, q):
    for line in stream:
        q.put(line)
    q.put(None)


def run_worker(version: str, hotfix_on: bool, models: Optional[List[str]], done: set, args, sink) -> None:
    """Run workers for one (version, hotfix) until every model type is recorded."""
    path = MATRIX / f"transformers-{version}"
    if not (path / ".complete").exists():
        raise SystemExit(f"{path} is not installed; run scripts/test.sh first")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTFIX_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(path)
    env["OMP_NUM_THREADS"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    if not hotfix_on:
        env["HOTFIX_DISABLE"] = "1"
    scratch = Path(tempfile.mkdtemp(prefix="hotfix-sweep-"))  # never write into tests/
    scratch.mkdir(parents=True, exist_ok=True)
    skip = set(done)
    while True:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--memory-limit", str(args.memory_limit),
               "--time-limit", str(args.time_limit)]
        if models:
            cmd += ["--models", ",".join(models)]
        if skip:
            cmd += ["--skip", ",".join(sorted(skip))]
        proc = subprocess.Popen(cmd, env=env, cwd=str(scratch), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        q: "queue.Queue" = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
        current, deadline, finished = None, time.monotonic() + args.model_timeout + 120, False
        while True:
            try:
                line = q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = "TIMEOUT"
            if line is None or line == "TIMEOUT":
                if line == "TIMEOUT":
                    proc.kill()
                proc.wait()
                if current is not None:
                    why = (f"worker killed after {args.model_timeout:.0f} s" if line == "TIMEOUT"
                           else f"worker died (exit {proc.returncode})")
                    row = {"model_type": current, "result": "timeout" if line == "TIMEOUT" else "died",
                           "detail": why, "transformers": version, "hotfix": hotfix_on}
                    sink(row)
                    skip.add(current)
                break
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "start" in msg:
                current, deadline = msg["start"], time.monotonic() + args.model_timeout
            elif "row" in msg:
                msg["row"]["transformers"] = version
                sink(msg["row"])
                skip.add(msg["row"]["model_type"])
                current = None
            elif msg.get("done"):
                finished = True
                sink({"model_type": "__done__", "result": "marker", "transformers": version, "hotfix": hotfix_on})
        if finished or current is None and proc.returncode == 0:
            return
        if current is None:  # died between models
            return


def load_results(path: Path) -> List[Dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def _cell(row: Optional[Dict]) -> str:
    if row is None:
        return "not run"
    result = row.get("result")
    if result == "pass":
        return "pass"
    if result == "FAIL":
        bits = []
        for mode, m in row.get("modes", {}).items():
            if m["status"] == "equal":
                continue
            if m["status"] == "wrong":
                parts = []
                if m["missing"]:
                    parts.append(f"{m['missing']}/{m['total']} missing")
                if m["wrong"]:
                    parts.append(f"{m['wrong']}/{m['total']} wrong")
                bits.append(f"{mode}: " + ", ".join(parts or ["differs"]))
            else:
                bits.append(f"{mode}: {m['status']} ({m['summary'].split(': ', 1)[-1][:70]})")
        return "**FAIL** " + "; ".join(bits)
    detail = (row.get("detail") or "").replace("|", "\\|")[:90]
    return f"{result}: {detail}"


def _note(model_type: str, before: Optional[Dict], after: Optional[Dict]) -> str:
    if not before or before.get("result") != "FAIL":
        return ""
    nonreentrant_ok = before.get("modes", {}).get("non-reentrant", {}).get("status") == "equal"
    if after and after.get("result") == "pass":
        return "fixed by hotfix"
    if model_type in OUT_OF_SCOPE:
        return "out of scope: " + OUT_OF_SCOPE[model_type]
    if not nonreentrant_ok:
        return "fails without reentrant checkpointing too: not a checkpoint-input problem"
    return "NOT FIXED"


def render(results: List[Dict], doc: Path, versions: List[str], torch_version: str) -> Dict:
    complete: Dict[str, set] = {}
    index: Dict = {}
    for row in results:
        if row["model_type"] == "__done__":
            complete.setdefault(row["transformers"], set()).add(bool(row.get("hotfix")))
            continue
        index[(row["transformers"], row["model_type"], bool(row.get("hotfix")))] = row
    today = _dt.date.today().isoformat()
    lines = [
        "# Sweep: transformers' own models through `hotfix check-model`",
        "",
        "Generated by `python tools/sweep_models.py` (see its docstring; `--fast` is the CI subset,",
        "`tests/test_sweep_fast.py`). Each model type's base class (`AutoModel` mapping) that",
        "`supports_gradient_checkpointing`, built on CPU from its config class's defaults shrunk to",
        "2 layers / width 32, dropout off; a dummy batch from `main_input_name`; one step without",
        "checkpointing against one with reentrant and one with non-reentrant checkpointing",
        "(`hotfix.checker.check_model`, float32 tolerance 1e-6 with the 1e-3 whole-gradient floor,",
        "memory guard 1 GiB and 40 s per step, 150 s per model). \"unpatched\" = `HOTFIX_DISABLE=1`.",
        "",
        "Run it (after `bash scripts/test.sh` has installed `.venv-test` and `.matrix/`):",
        "",
        "```",
        ".venv-test/bin/python tools/sweep_models.py                  # full: 4.56.2 and 5.23.0, hours on 2 cores",
        ".venv-test/bin/python tools/sweep_models.py --fast           # CI subset, ~40 s",
        ".venv-test/bin/python tools/sweep_models.py --versions 4.56.2 --hotfix off   # one half, to run halves in parallel",
        ".venv-test/bin/python tools/sweep_models.py --render-only    # rebuild this page from .sweep/results.jsonl",
        "```",
        "",
        "A model fails (**FAIL**) when some mode gives a missing or wrong gradient, crashes, or trips the",
        "memory/time guard. Cells: `N/M missing` = N of M trainable parameters got no gradient although",
        "the step without checkpointing gave them one. `could-not-build` / `could-not-run` = the generic",
        "small config or dummy batch does not fit that model (not a checkpointing result);",
        "`no-checkpointing` = the class does not support gradient checkpointing. Note: a failure that",
        "also happens with non-reentrant checkpointing is not a checkpoint-input problem (hotfix's class).",
        "",
    ]
    summary = {}
    for version in versions:
        types = sorted({k[1] for k in index if k[0] == version})
        rows = [(t, index.get((version, t, False)), index.get((version, t, True))) for t in types]
        checked = [r for r in rows if r[1] and r[1].get("result") in ("pass", "FAIL")]
        fail_before = [r for r in rows if r[1] and r[1].get("result") == "FAIL"]
        pass_after = [r for r in fail_before if r[2] and r[2].get("result") == "pass"]
        still = [r for r in fail_before if not (r[2] and r[2].get("result") == "pass")]
        nobuild = [r for r in rows if r[1] and r[1].get("result") not in ("pass", "FAIL", "no-checkpointing")]
        noc = [r for r in rows if r[1] and r[1].get("result") == "no-checkpointing"]
        summary[version] = {"model_types": len(rows), "checked": len(checked), "fail_unpatched": len(fail_before),
                            "pass_patched": len(pass_after), "still_failing": [r[0] for r in still],
                            "could_not_build_or_run": len(nobuild), "no_checkpointing": len(noc)}
        state = "complete" if complete.get(version) == {False, True} else "INCOMPLETE (the sweep did not finish; rows below are what ran)"
        lines += [
            f"## transformers {version} — run {today}, torch {torch_version}, CPU — {state}",
            "",
            f"{len(rows)} model types seen; {len(noc)} without checkpointing support; {len(nobuild)} could not be "
            f"built or run from a small config; {len(checked)} checked: **{len(fail_before)} fail unpatched, "
            f"{len(pass_after)} of them pass with hotfix**"
            + (f"; still failing: {', '.join(r[0] for r in still)}" if still else "") + ".",
            "",
            "| model type | class | transformers | unpatched | patched | note |",
            "|---|---|---|---|---|---|",
        ]
        order = sorted(rows, key=lambda r: (0 if r[1] and r[1].get("result") == "FAIL" else
                                            1 if r[1] and r[1].get("result") == "pass" else 2, r[0]))
        for t, before, after in order:
            cls = (before or after or {}).get("class", "")
            lines.append(f"| {t} | {cls} | {version} | {_cell(before)} | {_cell(after)} | {_note(t, before, after)} |")
        lines.append("")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(lines) + "\n")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--skip", default="", help=argparse.SUPPRESS)
    p.add_argument("--fast", action="store_true", help=f"CI subset: {','.join(FAST_MODELS)} on {FAST_VERSIONS}")
    p.add_argument("--versions", default=None, help="comma list (default: %s)" % ",".join(DEFAULT_VERSIONS))
    p.add_argument("--models", default="", help="comma list of model types (default: all)")
    p.add_argument("--results", default=None, help="JSON-lines results file (default: .sweep/results.jsonl)")
    p.add_argument("--doc", default=None, help="markdown table to write (default: docs/sweep.md)")
    p.add_argument("--fresh", action="store_true", help="ignore earlier results instead of resuming")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--hotfix", choices=("off", "on", "both"), default="both",
                   help="run only the unpatched (HOTFIX_DISABLE=1) or patched half (to run them in parallel)")
    p.add_argument("--memory-limit", type=int, default=2**30, help="bytes of RSS growth per step (default 1 GiB)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per step (default 60)")
    p.add_argument("--model-timeout", type=float, default=300.0, help="seconds per model before the worker is killed")
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args)
    versions = (args.versions.split(",") if args.versions else FAST_VERSIONS if args.fast else DEFAULT_VERSIONS)
    models = args.models.split(",") if args.models else (FAST_MODELS if args.fast else None)
    results_path = Path(args.results or REPO / ".sweep" / ("fast.jsonl" if args.fast else "results.jsonl"))
    doc = Path(args.doc or (REPO / ".sweep" / "fast.md" if args.fast else REPO / "docs" / "sweep.md"))
    results_path.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh and results_path.exists():
        results_path.unlink()
    results = load_results(results_path)
    import torch

    if not args.render_only:
        for version in versions:
            for hotfix_on in {"off": (False,), "on": (True,), "both": (False, True)}[args.hotfix]:
                done = {r["model_type"] for r in results
                        if r["transformers"] == version and bool(r.get("hotfix")) == hotfix_on}

                def sink(row, _on=hotfix_on):
                    row["hotfix"] = bool(row.get("hotfix", _on))
                    results.append(row)
                    results_path.parent.mkdir(parents=True, exist_ok=True)
                    with results_path.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"[{row['transformers']} hotfix {'on ' if _on else 'off'}] {row['model_type']:<28} "
                          f"{_cell(row)[:110]}", flush=True)

                run_worker(version, hotfix_on, models, done, args, sink)
    summary = render(results, doc, versions, torch.__version__)
    print(json.dumps(summary, indent=1))
    print(f"table: {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
