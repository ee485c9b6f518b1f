#!/usr/bin/env python3
"""How far the sweep's builder reaches: build every checkpointable model type and run one step.

    python -P -m hotfix_lab.sweep.sweep_probe --versions 4.56.2,5.23.0            # every type, minutes per release
    python -P -m hotfix_lab.sweep.sweep_probe --versions 5.23.0 --models qwen2_vl  # a few types, with the error
    python -P -m hotfix_lab.sweep.sweep_probe --versions 5.23.0 --recipe lora      # where LoRA trains nothing at all

No checkpointing and no comparison: only "can the sweep build this model type from a small
config and run forward + backward on its dummy batch" (``sweep_worker.build`` + the loss of
``hotfix.diagnostics.step``).  What fails here shows up in the sweep as ``could-not-build`` /
``could-not-run``; the probe finds it in minutes instead of hours, for work on the builder.
Prints one line per failing type and the reach per release.  With ``--recipe`` the recipe is
applied first, and a type where no trainable parameter gets a gradient even without checkpointing
is listed as ``no-grad`` (the sweep reports that recipe n/a instead of comparing None with None).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from hotfix_lab.infra.paths import TOOLS


def _probe_types(only, skip, per_model: float, memory: int, recipe: str = "") -> int:
    import resource
    import warnings

    import torch
    import transformers

    from hotfix_lab.sweep.sweep_recipes import NotApplicable, apply

    from hotfix_lab.sweep.sweep_worker import _model_types, _short, build

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()

    def alarm(*_):
        raise TimeoutError(f"over {per_model:.0f} s")

    signal.signal(signal.SIGALRM, alarm)
    # a model whose small config is still huge gets MemoryError, not the machine's OOM killer
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    from hotfix_lab.sweep import sweep_families

    for model_type, class_name, config_name in _model_types(only, with_variants=True):
        if model_type in skip:
            continue
        print(json.dumps({"start": model_type}), flush=True)
        reason = sweep_families.unbuildable(model_type)
        if reason:
            print(json.dumps({"type": model_type, "stage": "unbuildable", "error": reason}), flush=True)
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                declares = getattr(getattr(transformers, class_name), "supports_gradient_checkpointing", False)
        except BaseException as exc:
            print(json.dumps({"type": model_type, "stage": "import", "error": _short(exc)}), flush=True)
            continue
        if not declares:
            continue
        stage = "build"
        signal.alarm(int(per_model))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model, config, batch = build(model_type, class_name, config_name)
                if recipe:
                    stage = "recipe"
                    model = apply(model, recipe)
                stage = "run"
                from hotfix_lab.sweep.sweep_inputs import sweep_loss

                sweep_loss(model(**batch), batch).backward()
            trainable = [name for name, p in model.named_parameters() if p.requires_grad]
            idle = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
            if trainable and len(idle) == len(trainable):  # the sweep would compare nothing: n/a there
                print(json.dumps({"type": model_type, "stage": "no-grad", "error": f"none of {len(trainable)} "
                                  f"trainable parameters gets a gradient (e.g. {idle[0]})"}), flush=True)
            else:
                print(json.dumps({"type": model_type, "stage": "ok"}), flush=True)
        except NotApplicable as exc:
            print(json.dumps({"type": model_type, "stage": "n/a", "error": str(exc)}), flush=True)
        except BaseException as exc:
            print(json.dumps({"type": model_type, "stage": stage, "error": _short(exc)}), flush=True)
        finally:
            signal.alarm(0)
    return 0


def _probe_release(version: str, args) -> list:
    """Every type's row for one release; a type that kills its child is recorded and the child restarted."""
    from hotfix.diagnostics.children import child_env, json_lines, run_python

    from hotfix_lab.sweep.sweep_models import release_pythonpath

    env = child_env(False, keep_hotfix_settings=False, pythonpath=[*release_pythonpath(version), TOOLS],
                    extra={"OMP_NUM_THREADS": "1"})
    rows: list = []
    while True:
        cmd = ["-P", "-m", __spec__.name, "--child", "--per-model", str(args.per_model),
               "--memory", str(args.memory), "--skip", ",".join(r["type"] for r in rows), "--recipe", args.recipe]
        proc = run_python(cmd + (["--models", args.models] if args.models else []), env=env,
                          cwd=tempfile.gettempdir(), timeout=7200)
        lines = json_lines(proc.stdout)
        rows += [line for line in lines if "stage" in line]
        started = [line["start"] for line in lines if "start" in line]
        if proc.returncode == 0 or not started or started[-1] in {r["type"] for r in rows}:
            return rows
        rows.append({"type": started[-1], "stage": "died", "error": f"child died (exit {proc.returncode})"})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--versions", default="4.56.2,4.57.6,5.23.0")
    p.add_argument("--models", default="", help="comma list of model types (default: every type)")
    p.add_argument("--per-model", type=float, default=120.0, help="seconds per model type (default 120)")
    p.add_argument("--memory", type=float, default=8.0, help="GiB of address space per probe child (default 8)")
    p.add_argument("--skip", default="", help=argparse.SUPPRESS)
    p.add_argument("--recipe", default="", help="apply this sweep recipe first (lora, ...): also finds types where "
                   "it trains nothing (no trainable parameter gets a gradient even without checkpointing)")
    p.add_argument("--json", action="store_true", help="print every type's line, as JSON")
    p.add_argument("--doc", default=None, help="also write the reach and every failing type to this markdown file")
    args = p.parse_args(argv)
    only = args.models.split(",") if args.models else None
    if args.child:
        return _probe_types(only, set(filter(None, args.skip.split(","))), args.per_model, int(args.memory * 2**30),
                            args.recipe)
    report = []
    for version in args.versions.split(","):
        rows = _probe_release(version, args)
        types = [r for r in rows if "+" not in r["type"]]  # variants (<type>+<name>) are extra rows, not types
        ok = sum(r["stage"] == "ok" for r in types)
        report.append((version, ok, rows))
        for r in rows:
            if args.json:
                print(json.dumps(dict(r, transformers=version)))
            elif r["stage"] != "ok":
                print(f"{version} {r['type']:<32} {r['stage']:<6} {r.get('error', '')[:150]}")
        print(f"reach {version}: {ok}/{len(types)} checkpointable model types built and stepped")
        variants = [r for r in rows if "+" in r["type"]]
        if variants:
            print(f"variants {version}: {sum(r['stage'] == 'ok' for r in variants)}/{len(variants)} built and stepped "
                  f"({', '.join(r['type'] for r in variants)})")
    if args.doc:
        _write_doc(Path(args.doc), report, args.models)
    return 0


def _write_doc(doc: Path, report, models: str) -> None:
    import datetime
    import platform

    import torch

    lines = ["# Sweep builder reach (`tools/hotfix_lab/sweep/sweep_probe.py`)", "",
             f"Measured {datetime.date.today().isoformat()}, torch {torch.__version__}, CPU ({platform.machine()})"
             + (f", model types {models}" if models else ", every model type whose base class declares"
                " `supports_gradient_checkpointing` (or whose module cannot be imported here)") + ".",
             "Built from the generic small config plus `tools/hotfix_lab/sweep/sweep_families/`, one forward + backward, no",
             "checkpointing and no comparison: what the sweep (`docs/sweep.md`) can check at all.", ""]
    for version, ok, rows in report:
        types = [r for r in rows if "+" not in r["type"]]
        lines += [f"reach {version}: {ok}/{len(types)} checkpointable model types built and stepped", ""]
    lines += ["| transformers | model type | stage | why |", "|---|---|---|---|"]
    for version, _, rows in report:
        for r in rows:
            if r["stage"] != "ok":
                lines.append(f"| {version} | {r['type']} | {r['stage']} | {r.get('error', '').replace('|', '/')} |")
    doc.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
