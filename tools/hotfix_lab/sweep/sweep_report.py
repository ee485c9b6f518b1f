"""The sweep's report: docs/sweep.md from the results file (JSON lines)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional

from hotfix_lab.sweep import sweep_store
from hotfix_lab.sweep.sweep_rounding import ROUNDING_SIZED, rounding_note


# Failures that remain with hotfix and that the float64 re-check (sweep_rounding) does not settle, each with its
# mechanism, found by hand: rounding above ROUNDING_SIZED or in a model that cannot run in float64, or an
# upstream defect outside checkpointing.  Shown only where the model still fails with hotfix; every entry is
# read by some row of docs/sweep-results/ (tests/unit/test_sweep_tools.py).
OUT_OF_SCOPE: Dict[str, str] = {
    # Checked with `sweep_models.py --dtype float64` by hand (torch's function, 5.23.0, 2026-11-23); where upstream
    # fails by a crash or missing adapters, those stay in float64: they are real, and hotfix removes them.
    "autoformer": "hotfix removes the upstream failure (full: backward through the graph a second time; LoRA: 24 "
    "of 24 adapters get no gradient); what remains is rounding: up to 1.0e-5 relative in fp32 under reentrant "
    "recomputation, 2.2e-14 in float64 (its own .float() casts run as .double(); 4.57.6: 2.3e-14, 2026-11-24); no "
    "gradient is missing",
    "deformable_detr": "rounding on gradients that are exactly zero, not gradient loss: input_proj's level-3 conv "
    "and biases feed a GroupNorm with one channel per group (level 3 is 1x1), whose output does not depend on "
    "them; fp32 noise there (amplified ~316x by the zero-variance backward) is summed in another order by "
    "reentrant's inner backward: 1.1e-3 relative under the whole-gradient floor in fp32; in float64 2.1e-12 "
    "(4.57.6: 3.8e-12, 2026-11-24), "
    "non-reentrant bit-exact; no gradient is missing",
    "deta": "hotfix removes the upstream failure (full and frozen tower: backward through the graph a second "
    "time, decoder tensors passed by keyword; LoRA: 12 of 16 adapters get no gradient); what remains is "
    "deformable_detr's rounding (DETA is built on it): input_proj's level-3 conv feeding a one-channel-per-group "
    "GroupNorm up to 1.3e-3 relative, the ResNet backbone's convs before BatchNorm 1.6e-6 to 9.6e-6, in fp32 under "
    "reentrant recomputation; in float64 all 117 agree to 4.0e-12 (4.56.2 and 4.57.6, 2026-11-24), non-reentrant "
    "bit-exact; no gradient is missing",
    "clvp": "an upstream call that bypasses the model's checkpoint function (4.x to 5.0; 5.23.0 passes): CLVP's "
    "text/speech encoder and decoder loops call torch.utils.checkpoint.checkpoint(layer.__call__, ...) "
    "directly, without use_reentrant, so torch's default (reentrant) runs whatever the user asked for; with "
    "the base frozen no input of those layers requires grad and all 16 encoder adapters get no gradient in "
    "every mode, upstream and with hotfix (4.56.2 and 4.57.6, 2026-11-24). hotfix's frozen-inputs fix acts on the "
    "model's _gradient_checkpointing_func; reaching this call would mean replacing torch.utils.checkpoint"
    ".checkpoint process-wide, and torch.compile recognises activation checkpointing by that function's "
    "identity, so every other compiled checkpoint call would change",
    "recurrent_gemma": "an upstream defect outside checkpointing (4.x; 5.23.0 passes): each RG-LRU block keeps its "
    "last forward's recurrent_states, graph included, on the module and feeds it into the next forward's scan "
    "(times zero at position 0, still in the graph), so a second training step crashes with \"Trying to backward "
    "through the graph a second time\" without checkpointing and without hotfix (4.56.2 and 4.57.6, 2026-11-24); the "
    "non-reentrant step is the checker's third forward on the model, after the reentrant step's recomputation left "
    "such a state",
    "pi0": "a model that cannot train with checkpointing at all, not a lost input: PI0 hands the VLM prefix's "
    "keys/values to its action expert through the KV cache (vlm(..., use_cache=True).past_key_values), and with "
    "checkpointing on in training transformers turns caching off (its config-defaults decorator sets "
    "use_cache=False, since a cache written in a checkpointed forward would be written again on recomputation), "
    "so past_key_values is None: the same AttributeError with reentrant, non-reentrant and unsloth's function, "
    "with and without hotfix (5.23.0)",
}


def load_results(path: Path) -> List[Dict]:
    return mark_upstream_crashes([json.loads(line) for line in sweep_store.read_lines(path)])


def _cell_key(row: Dict) -> tuple:
    if row["model_type"].startswith("__"):
        return (row["model_type"], row["transformers"], bool(row.get("hotfix")), function_of(row),
                row.get("dtype", "float32"))
    return _twin_key(row) + (bool(row.get("hotfix")),)


def compact_results(path: Path) -> int:
    """Keep, per cell, only the row the report uses (the last one written), and one copy of each census and end
    marker, in the order of their last writing.  A re-run appends; the tracked rows would otherwise grow with
    every superseded row.  Returns how many rows were dropped."""
    return sweep_store.compact(path, _cell_key)


def _twin_key(row: Dict) -> tuple:
    return (row["transformers"], row["model_type"], recipe_of(row), function_of(row), row.get("dtype", "float32"))


def mark_upstream_crashes(results: List[Dict]) -> List[Dict]:
    """An unpatched row whose step *without* checkpointing crashed ("could-not-run") while its patched twin ran
    and was compared is an upstream failure that hotfix removes, not a model the builder cannot run: it becomes
    a FAIL whose mode ``without checkpointing`` is that crash.  (The lora-input-grads recipe calls
    ``enable_input_require_grads()`` before the reference step; on GIT, BLIP, BLT and CSM upstream's hook makes
    that step crash, ``transformers-input-grads-leaf``.)  A memory or time guard stopping that step is not a
    crash: it stays could-not-run."""
    ran = {_twin_key(r) for r in results if r.get("hotfix") and r.get("result") in CHECKED}
    marked = []
    for row in results:
        guarded = (row.get("detail") or "").split(":", 1)[0].endswith("guard")  # memory/time guard: not a crash
        if not row.get("hotfix") and row.get("result") == "could-not-run" and not guarded and _twin_key(row) in ran:
            crash = {"status": "crash", "summary": row.get("detail") or "", "missing": 0, "wrong": 0, "total": 0}
            row = dict(row, result="FAIL", modes={"without checkpointing": crash})
        marked.append(row)
    return marked


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


CHECKED = ("pass", "FAIL")
DONE = CHECKED + ("n/a",)  # n/a: the recipe does not apply to the model (no tower, no projection)


def recipe_of(row: Dict) -> str:
    return row.get("recipe", "full")  # rows written before recipes existed are full fine-tuning


def function_of(row: Dict) -> str:
    return row.get("function", "torch")  # rows written before functions existed ran torch's


def _column(recipe: str, function: str) -> str:
    return recipe if function == "torch" else f"{recipe} ({function})"


def _short_cell(before: Optional[Dict], after: Optional[Dict]) -> str:
    """'pass', 'FAIL → pass', 'FAIL → **FAIL**', 'n/a', or what kept the pair from being checked."""
    if before is None or after is None:
        return "not run"
    b, a = before.get("result"), after.get("result")
    if b == a and b in ("pass", "n/a"):
        return b
    if b in CHECKED and a in CHECKED:
        return f"{'**FAIL**' if b == 'FAIL' else b} → {'**FAIL**' if a == 'FAIL' else a}"
    first = before if b not in CHECKED + ("n/a",) else after
    return f"{first.get('result')}: " + (first.get("detail") or "").replace("|", "\\|")[:60]


def _note(model_type: str, pairs: Dict[str, tuple]) -> str:
    notes = []
    for recipe, (before, after) in pairs.items():
        settled = [rounding_note(before), rounding_note(after)]
        if settled[0] and settled[0] == settled[1]:
            notes.append(f"{recipe}, without and with hotfix: {settled[0]}")
        else:
            notes += [f"{recipe}, {half} hotfix: {note}" for half, note in zip(("without", "with"), settled) if note]
        if not before or before.get("result") != "FAIL":
            continue
        label = f"{recipe}: {_cell(before).replace('**FAIL** ', '')}"
        if after is None:  # a run stopped part-way: the half with hotfix has not reached this type yet
            notes.append(f"{label}; not yet run with hotfix")
        elif after.get("result") == "pass":
            notes.append(f"{label}; fixed by hotfix")
        elif model_type in OUT_OF_SCOPE:
            notes.append(f"{label}; out of scope: {OUT_OF_SCOPE[model_type]}")
        elif before.get("modes", {}).get("non-reentrant", {}).get("status", "equal") != "equal":
            notes.append(f"{label}; fails without reentrant checkpointing too: not a checkpoint-input problem")
        else:
            notes.append(f"{label}; NOT FIXED")
    return "<br>".join(notes)


def _torch_of(row: Dict, torch_version: str) -> str:
    """The torch a row ran under; rows restored from an earlier page record none: the page's (the renderer's)."""
    return row.get("torch") or torch_version


def _when(rows: List[Dict], torch_version: str) -> str:
    """When and with which torch a line's rows ran, as the rows record it (``date`` and ``torch``, written by
    each run since 2026-11-24), not the day the page was rendered."""
    dates = sorted({r["date"] for r in rows if r.get("date")})
    torches = sorted({_torch_of(r, torch_version) for r in rows})
    parts = [f"run {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "")] if dates else []
    restored = sum(1 for r in rows if r.get("restored"))
    if restored:
        parts.append(f"{restored} of {len(rows)} rows restored from an earlier page (their run dates not recorded)")
    return "; ".join(parts or ["run date not recorded"]) + f"; torch {', '.join(torches)}"


def census(results: List[Dict], version: str) -> Optional[Dict]:
    rows = [r for r in results if r["model_type"] == "__census__" and r["transformers"] == version]
    return rows[-1] if rows else None


def coverage(results: List[Dict], version: str, recipes=None, functions=("torch",)) -> Dict:
    """checked = built, run and compared, without and with hotfix, in every recipe (n/a where it does not
    apply) through every checkpoint function; checkpointable = declares supports_gradient_checkpointing
    (the census of every model type)."""
    recipes = list(recipes or RECIPE_ORDER)
    index = {(r["model_type"], recipe_of(r), bool(r.get("hotfix")), function_of(r)): r
             for r in results if r["transformers"] == version and not r["model_type"].startswith("__")}
    found = census(results, version)
    types = set(found["checkpointable"]) if found else {k[0] for k in index}
    checked = sorted(t for t in types
                     if all(index.get((t, rec, on, f), {}).get("result") in DONE
                            for rec in recipes for on in (False, True) for f in functions)
                     and index.get((t, "full", False, "torch"), {}).get("result") in CHECKED)
    return {"checked": checked, "checkpointable": sorted(types), "census": found is not None}


def render(results: List[Dict], doc: Path, versions: List[str], torch_version: str, recipes=None,
           functions=("torch",)) -> Dict:
    recipes = list(recipes or RECIPE_ORDER)
    complete: Dict[str, set] = {}
    index: Dict = {}
    for row in results:
        if row["model_type"] == "__done__":
            complete.setdefault(row["transformers"], set()).add((bool(row.get("hotfix")), function_of(row)))
        elif not row["model_type"].startswith("__") and function_of(row) in functions:
            index[(row["transformers"], row["model_type"], recipe_of(row), bool(row.get("hotfix")),
                   function_of(row))] = row
    columns = [(r, f) for f in functions for r in recipes]
    cut = HEADER.index("```") - 1  # the restored rows' note goes before the commands
    lines = HEADER[:cut] + (RESTORED if any(r.get("restored") for r in results) else ALL_RUN) + HEADER[cut:] + [""]
    summary = {}
    for version in versions:
        # the checkpoint functions the sweep ran on this line: each of them counts for coverage
        ran = [f for f in functions if any(k[0] == version and k[4] == f for k in index)] or ["torch"]
        cov = coverage(results, version, RECIPE_ORDER, ran)
        types = sorted({k[1] for k in index if k[0] == version})
        cols = [c for c in columns if c[1] in ran]
        halves = {(on, f) for on in (False, True) for f in ran}
        # every half done (its marker), and no half behind another: a marker from an earlier, finished run
        # does not make a later run that was stopped part-way complete
        reached = {h: {k[1] for k in index if k[0] == version and (k[3], k[4]) == h} for h in halves}
        finished = complete.get(version, set()) >= halves and all(r == set(types) for r in reached.values())
        state = "complete" if finished else "INCOMPLETE (the sweep did not finish; rows below are what ran)"
        if cov["census"] and len(types) < len(cov["checkpointable"]):
            state += f" for the {len(types)} model types below (a subset: `--models`)"
        rows = [r for r in results if r["transformers"] == version and not r["model_type"].startswith("__")]
        lines += [f"## transformers {version} — {_when(rows, torch_version)}, CPU — {state}", "",
                  f"coverage {version}: {len(cov['checked'])}/{len(cov['checkpointable'])} model types", "",
                  f"(checkpoint functions run on this line, each required for a type to count as checked: "
                  f"{', '.join(ran)})", ""]
        if not cov["census"]:
            lines += ["(no census of this release's model types: the denominator counts only the types that ran)", ""]
        summary[version] = {"coverage": f"{len(cov['checked'])}/{len(cov['checkpointable'])}"}
        for recipe, function in cols:
            pairs = [(t, index.get((version, t, recipe, False, function)), index.get((version, t, recipe, True, function)))
                     for t in types]
            checked = [p for p in pairs if p[1] and p[1].get("result") in CHECKED]
            failing = [p for p in checked if p[1]["result"] == "FAIL"]
            fixed = [p for p in failing if p[2] and p[2].get("result") == "pass"]
            regressed = [p[0] for p in checked if p[1]["result"] == "pass" and p[2] and p[2].get("result") == "FAIL"]
            na = [p for p in pairs if p[1] and p[1].get("result") == "n/a"]
            still = [p[0] for p in failing if p not in fixed]
            summary[version][_column(recipe, function)] = {"checked": len(checked), "fail_unpatched": len(failing),
                                        "pass_patched": len(fixed), "still_failing": still, "regressed": regressed}
            lines.append(f"- **{_column(recipe, function)}**: {len(checked)} checked, {len(na)} n/a; {len(failing)} fail unpatched, "
                         f"{len(fixed)} of them pass with hotfix"
                         + (f"; still failing: {', '.join(still)}" if still else "")
                         + (f"; **pass unpatched but fail with hotfix: {', '.join(regressed)}**" if regressed else ""))
        lines += ["", "| model type | class | " + " | ".join(_column(*c) for c in cols) + " | note |",
                  "|---|---|" + "---|" * len(cols) + "---|"]
        usual = Counter(_torch_of(r, torch_version) for r in rows).most_common(1)[0][0] if rows else ""
        for t in types:
            pairs = {_column(r, f): (index.get((version, t, r, False, f)), index.get((version, t, r, True, f)))
                     for r, f in cols}
            cls = next((row.get("class", "") for pair in pairs.values() for row in pair if row), "")
            cells = " | ".join(_short_cell(*pairs[_column(*c)]) for c in cols)
            # a type measured under another torch than the rest of its line (Gemma-3n: timm needs a torchvision
            # that PyPI has for torch 2.14.1 only) says so
            other = sorted({_torch_of(row, torch_version) for pair in pairs.values() for row in pair if row} - {usual})
            note = "<br>".join(filter(None, [f"run under torch {', '.join(other)}" if other else "", _note(t, pairs)]))
            lines.append(f"| {t} | {cls} | {cells} | {note} |")
        lines.append("")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(lines) + "\n")
    return summary


RECIPE_ORDER = ("full", "lora", "lora-input-grads", "frozen-tower")

HEADER = [
    "# Sweep: transformers' own models through `hotfix check-model`, per recipe",
    "",
    "Generated by `python -P -m hotfix_lab.sweep.sweep_models` (see its docstring; `--fast` is the CI subset,",
    "`tests/versions/test_sweep_fast.py`). Each model type's base class (`AutoModel` mapping) that",
    "`supports_gradient_checkpointing`, built on CPU from its config class's defaults shrunk to",
    "2 layers / width 32, dropout off; a dummy batch from `main_input_name`; the model's own loss,",
    "else a fixed random projection of every float output; one step without",
    "checkpointing against one with reentrant and one with non-reentrant checkpointing",
    "(`hotfix.diagnostics.checker.check_model`, float32 tolerance 1e-6 with the 1e-3 whole-gradient",
    f"floor; a float32 row whose every failing mode differs by values within {ROUNDING_SIZED:g} relative only, no",
    "gradient missing or unexpected, is measured again in float64, `tools/hotfix_lab/sweep/sweep_rounding.py`, the",
    "census's rule too: equal there, it passes and its note says so), for each recipe",
    "(`tools/hotfix_lab/sweep/sweep_recipes.py`): **full** fine-tuning; **lora** = PEFT LoRA",
    "(r=4) on the attention projections, base frozen, no `enable_input_require_grads()`;",
    "**lora-input-grads** = the same after `enable_input_require_grads()`; **frozen-tower** = the",
    "vision/audio tower frozen, the rest trains. Each recipe runs through every checkpoint function:",
    "**torch** (`torch.utils.checkpoint`, reentrant and non-reentrant) and **unsloth** (unsloth-zoo",
    "2026.10.9's `UnslothCheckpointFunction` swapped in for torch's by its own",
    "`patch_unsloth_smart_gradient_checkpointing`, loaded on CPU by `tools/hotfix_lab/infra/zoo_loader.py`; reentrant",
    "only, as unsloth-zoo forces on transformers 5.x); columns marked `(unsloth)`. Model types the",
    "generic small config does not fit get their sizes and inputs from `tools/hotfix_lab/sweep/sweep_families/`",
    "(facts learnt from transformers' own model tests). Rows `<type>+<variant>` switch on an optional",
    "path that passes tensors between layers (`tools/hotfix_lab/sweep/sweep_families/config_variants.py`:",
    "`deberta-v2+layer_norm`, `gemma4+kv_shared`; `gemma4+kv_shared_cache`, `gemma3n_text+cache` keep the",
    "config's `use_cache=True`, as a model loaded from the Hub trains); they are extra rows, outside the",
    "coverage count.",
    "The types with a timm vision tower (Gemma-3n, FastVLM, PerceptionLM) run under torch 2.14.1 with",
    "timm's smallest ConvNeXt/ViT as the tower (timm needs a torchvision PyPI has for that torch only);",
    "their rows say so.",
    "Cells read `unpatched → with hotfix`",
    "(unpatched = `HOTFIX_DISABLE=1`); `n/a` = the recipe does not apply (no tower, no projection PEFT",
    "can wrap); `could-not-build` / `could-not-run` = the generic small config or dummy batch does",
    "not fit that model (not a checkpointing result); where only the unpatched step *without*",
    "checkpointing crashed and hotfix's ran, that crash is upstream's failure (`FAIL`, \"without",
    "checkpointing: crash\"), e.g. lora-input-grads on GIT/BLIP/BLT/CSM (`transformers-input-grads-leaf`).",
    "",
    "`coverage <release>: <checked>/<checkpointable> model types`: checkpointable = the model types",
    "whose base class declares `supports_gradient_checkpointing` (a census of every type of the",
    "release); checked = built, run and compared without and with hotfix in every recipe that applies,",
    "through every checkpoint function the sweep ran. `tools/hotfix_lab/sweep/sweep_probe.py` measures in minutes how",
    "many types the builder reaches (build + one step, no comparison).",
    "",
    "The rows behind this page are in `docs/sweep-results/` (tracked, one gzip file of JSON lines per release line, one object per cell and half);",
    "this page is rendered from them alone.",
    "",
    "```",
    ".venv-test/bin/python -P -m hotfix_lab.sweep.sweep_models --jobs 2                  # 4.56.2, 4.57.6 and 5.23.0, every type, hours",
    ".venv-test/bin/python -P -m hotfix_lab.sweep.sweep_models --models llama,whisper    # a subset",
    ".venv-test/bin/python -P -m hotfix_lab.sweep.sweep_models --fast                    # CI subset",
    ".venv-test/bin/python -P -m hotfix_lab.sweep.sweep_models --render-only             # this page from docs/sweep-results/",
    "```",
]

#: said once no line holds rows restored from the page
ALL_RUN = ["Every row is a run's own: its date, torch, counts and errors as the run wrote them."]

#: said while a line still holds rows restored from the page (its heading: "N of M rows restored")
RESTORED = [
    "Rows marked `\"restored\": \"docs/sweep.md\"` are not a run's: they were rebuilt from this page on 2026-11-24,",
    "after the untracked raw file was lost with a checkout, and hold what the page showed (each result, its",
    "detail, the unpatched half's failing modes and counts), not byte counts or error magnitudes; rendered again",
    "they gave the page they came from unchanged (checked when they were restored).",
]


def _verdict(before: Optional[Dict], after: Optional[Dict]) -> str:
    """One compact cell: ✓ (passes upstream), ✗→✓ (fixed by hotfix), ✗ (fails with hotfix too), – (n/a), ? (not checked)."""
    b, a = (before or {}).get("result"), (after or {}).get("result")
    if b == "n/a":
        return "–"
    if b not in CHECKED or a not in CHECKED:
        return "?"
    return {("pass", "pass"): "✓", ("FAIL", "pass"): "✗→✓", ("FAIL", "FAIL"): "✗", ("pass", "FAIL"): "✓→✗"}[(b, a)]


def compact_table(results: List[Dict], families: List[str], versions: List[str], recipes=None) -> str:
    """The README's table: model family x transformers line x recipe -> upstream / with hotfix."""
    recipes = list(recipes or RECIPE_ORDER)
    index = {(r["transformers"], r["model_type"], recipe_of(r), bool(r.get("hotfix"))): r
             for r in results if not r["model_type"].startswith("__") and function_of(r) == "torch"}
    lines = ["| model type | transformers | " + " | ".join(recipes) + " |", "|---|---|" + "---|" * len(recipes)]
    for family in families:
        for v in versions:
            cells = [_verdict(index.get((v, family, r, False)), index.get((v, family, r, True))) for r in recipes]
            lines.append(f"| {family} | {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
