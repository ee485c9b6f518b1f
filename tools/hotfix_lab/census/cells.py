"""The census's fixed core: which cell probes which mechanism, and a row's verdict.

A transformers cell is a model type (``+variant`` as in tools/hotfix_lab/sweep/sweep_families) and a sweep recipe
(hotfix_lab.sweep.sweep_recipes), or a case of hotfix_lab.cases.grad_case (``lab/<case>``: what no built-in
model shows, e.g. a third-party GradientCheckpointingLayer); its verdict is the reentrant mode's,
compared with the step without checkpointing by hotfix's own rule.  An unsloth-zoo cell is a case of
hotfix_lab.cases.zoo_cases.  A compile cell (``compile/<model>/<backend>``) is hotfix_lab.cases.compile_case: a
checkpointed model under ``torch.compile``, its verdict and dynamo's counts (graphs, breaks, frames,
recompiles), which must be the same with hotfix as without.
Verdicts: equal | wrong | crash | guard (memory/time guard) | late (step 1 offloads nothing) | n/a
(absent, not applicable, no checkpointing) | error (the cell could not be built or run; measured again
on the next run).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

#: (model type, recipe, mechanism): one per mechanism of the fixes, several where models differ
CELLS: List[Tuple[str, str, str]] = [
    ("whisper", "full", "keyword-tensors"),
    ("deberta-v2+layer_norm", "full", "keyword-tensors"),
    ("wavlm", "full", "keyword-tensors"),
    ("layoutlm", "full", "keyword-tensors"),
    ("pvt_v2", "full", "nested-outputs"),
    ("gemma3n_text", "full", "shared-mapping"),
    ("gemma3n_text+cache", "full", "shared-mapping"),  # use_cache on: where the Cache carries the sharing
    ("gemma4+kv_shared", "full", "shared-mapping"),
    ("gemma4+kv_shared_cache", "full", "shared-mapping"),  # ... Gemma-4 5.5.0 - 5.5.1 (transformers#45242)
    ("diffusion_gemma", "full", "cache-contents"),
    ("lilt", "full", "unused-outputs"),
    ("whisper", "lora", "frozen-layer-inputs"),  # LoRA without enable_input_require_grads()
    ("whisper", "lora-input-grads", "frozen-layer-inputs"),  # after it: 4.x hooks only the decoder
    ("git", "lora-input-grads", "in-place-on-leaf"),
    ("swin", "lora-input-grads", "tuple-embeddings"),
]

#: cells measured on the transformers releases, not on each torch line: the state they probe (a Cache the layers
#: share keys/values through) is dropped by transformers' own GradientCheckpointingLayer (past_key_values=None)
#: before any checkpoint function runs, whatever the torch; at the torch lines' release the cells without the Cache
#: measure the same mechanism
RELEASE_ONLY = ("gemma3n_text+cache/full", "gemma4+kv_shared_cache/full")

#: (grad_case.py case, mechanism): full fine-tuning of tools/hotfix_lab/infra/tiny_models.py's builders
LAB_CELLS: List[Tuple[str, str]] = [
    ("whisper-frozen-decoder-embeddings", "keyword-tensors"),  # only the keyword tensor needs grad
    ("custom-layer", "keyword-tensors"),  # a third-party GradientCheckpointingLayer, tensor by keyword
    ("custom-layer-nested", "keyword-tensors"),  # ... inside a container passed by keyword
    ("custom-layer-positional", "keyword-tensors"),  # ... inside a container passed positionally
]

#: (zoo_cases.py case, mechanism)
ZOO_CASES: List[Tuple[str, str]] = [
    ("closure", "closure-tensors"),
    ("whisper", "closure-tensors"),  # a tiny Whisper through unsloth's function (keyword tensors in the partial)
    ("frozen", "frozen-first-input"),
    ("offload", "late-offload"),
]

#: (model, backend) of tools/hotfix_lab/cases/compile_case.py: the compile column, one per torch line
COMPILE_CASES: List[Tuple[str, str]] = [
    ("whisper", "eager"),  # dynamo alone (the torch 2.11 crash: tests/versions/test_torch_lines.py)
    ("llama", "eager"),
    ("whisper", "inductor"),  # the default backend: AOT autograd and generated code
    ("llama", "inductor"),
]
#: dynamo's counts a compile row keeps: hotfix on must equal hotfix off
COMPILE_COUNTS = ("graphs", "breaks", "frames", "recompiles")

#: the verdicts that count as broken (the pages' *broken*; a row with one and hotfix on must say why)
BROKEN = ("wrong", "crash", "guard", "late")


def state(verdicts: Iterable[str]) -> str:
    """One word for a set of cell verdicts: broken beats unmeasured beats fine; n/a only when all are."""
    found = set(verdicts)
    if not found:
        return "–"
    if found & set(BROKEN):
        return "broken"
    if "error" in found:
        return "error"
    if found <= {"n/a"}:
        return "n/a"
    return "fine"


#: (case, release) -> why a cell stays broken with hotfix: each such row of docs/versions.md says it
#: (tests/versions/test_version_gates.py fails on one without)
BROKEN_WITH_HOTFIX = {
    ("diffusion_gemma/full", "5.11.0"):
        "not a checkpoint-function defect: non-reentrant checkpointing gives the same 43 wrong gradients. "
        "5.11's GradientCheckpointingLayer sets past_key_values=None under checkpointing, so DiffusionGemma's "
        "decoder runs without the encoder's KV cache: another forward than without checkpointing. 5.12-5.14 "
        "turned checkpointing off for the model; 5.15 keeps the cache",
}

#: why hotfix changes dynamo's counts on a torch line, gradients equal (the page lists each; tests/versions/
#: test_version_gates.py fails on any other difference)
COMPILE_DIFFERS_WITH_HOTFIX: Dict[str, str] = {
    "2.4.1": "Llama (transformers 4.44.2), eager and inductor backends: one more graph and frame, one recompile "
             "in step 2 (Whisper equal). "
             "Dynamo 2.4 guards the checkpoint function of a module it specializes by reading the attribute in "
             "eager code, where the slot hands out hotfix's wrapper, while it traced the raw function: the frame "
             "resumed after Llama's graph break is compiled once more; gradients equal",
}

#: (torch line, checkpoint function) -> why the compile cells are broken with hotfix there; each fails
#: without hotfix the same way (tools/hotfix_lab/census/gates.py's compile_problems lists any line where hotfix breaks
#: what upstream runs unless COMPILE_OPEN_DEFECTS names it)
_UNSLOTH_COMPILE = ("upstream too (the same error without hotfix): unsloth-zoo's checkpoint function under "
                    "torch.compile's eager backend on torch >= 2.12 passes checkpoint options dynamo accepts only "
                    "with use_reentrant=False (the inductor backend trains where measured)")
_TORCH_2_6 = ("upstream too (the same error without hotfix): torch.compile on torch 2.6 with transformers 5.23.0 "
              "fails with \"NameError: name 'torch' is not defined\"")
_TORCH_2_5_INDUCTOR = ("upstream too (the same gradients without hotfix): on torch 2.5.1 the inductor backend on the "
                       "CPU gives other gradients than an uncompiled step (max relative error 0.26 Whisper, 0.75 "
                       "Llama); the eager backend is equal")
COMPILE_BROKEN_WITH_HOTFIX = {
    **{("2.5.1", function): _TORCH_2_5_INDUCTOR for function in ("torch", "unsloth")},
    **{("2.6.0", function): _TORCH_2_6 for function in ("torch", "unsloth")},
    **{(torch, "unsloth"): _UNSLOTH_COMPILE for torch in ("2.12.1", "2.13.0", "2.14.1", "2.15.0")},
}
#: torch lines where hotfix breaks torch.compile that upstream runs: open defects, listed on the page.
#: None since 2026-11-27: 2.6 / 2.7 failed dynamo's guard check with hotfix until the checkpoint slot
#: became a property (hotfix/checkpointing/slot.py; tests/versions/test_torch_lines.py runs 2.7.1)
COMPILE_OPEN_DEFECTS: Tuple[str, ...] = ()


def broken_reason(row: Dict) -> Optional[str]:
    """Why ``row``, broken with hotfix, is: BROKEN_WITH_HOTFIX's reason, or for a compile cell its torch line's."""
    if row["dimension"] == "compile":
        return COMPILE_BROKEN_WITH_HOTFIX.get((row["torch"], row["function"]))
    return BROKEN_WITH_HOTFIX.get((row["case"], row["release"]))


#: verdicts measured again by the next run (the cell never produced a measurement)
RETRY = ("error",)

MECHANISM = {f"{model}/{recipe}": mechanism for model, recipe, mechanism in CELLS}
MECHANISM.update({f"lab/{case}": mechanism for case, mechanism in LAB_CELLS})
MECHANISM.update({f"zoo/{case}": mechanism for case, mechanism in ZOO_CASES})
MECHANISM.update({f"compile/{model}/{backend}": "torch-compile" for model, backend in COMPILE_CASES})


def by_recipe(only=()) -> Dict[str, List[str]]:
    """recipe -> model types of the transformers cells (``only``: these ``model/recipe`` cells)."""
    grouped: Dict[str, List[str]] = {}
    for model, recipe, _ in CELLS:
        if not only or f"{model}/{recipe}" in only:
            grouped.setdefault(recipe, []).append(model)
    return grouped


def _row(dimension, release, function, case, hotfix, verdict, detail="", **extra) -> Dict:
    return dict(dimension=dimension, release=release, function=function, case=case, hotfix=hotfix,
                mechanism=MECHANISM[case], verdict=verdict, detail=detail[:160], **extra)


def transformers_row(row: Dict, version: str, hotfix: bool, function: str) -> Dict:
    """A sweep row (tools/hotfix_lab/sweep/sweep_worker.check_one) as a census row; a reentrant difference of rounding size
    measured again in float64 (tools/hotfix_lab/sweep/sweep_rounding.settle) is equal where it is equal there."""
    case = f"{row['model_type']}/{row.get('recipe', 'full')}"
    result = row.get("result")
    if result in ("pass", "FAIL"):
        mode = row["modes"]["reentrant"]
        verdict = {"equal": "equal", "wrong": "wrong", "crash": "crash", "guard": "guard"}.get(mode["status"], "error")
        detail = mode.get("summary", "")
        again = (row.get("float64") or {}).get("reentrant")
        if again is not None:
            if again["status"] == "equal":
                verdict, detail = "equal", f"float64: {again['summary']}; float32 rounding: {detail}"
            else:
                detail = f"{detail}; float64 too: {again['summary']}"
        return _row("transformers", version, function, case, hotfix, verdict, detail)
    if result in ("n/a", "no-checkpointing"):
        return _row("transformers", version, function, case, hotfix, "n/a", row.get("detail", result))
    if result == "could-not-run" and not str(row.get("detail", "")).startswith(("memory guard", "time guard")):
        # the step without checkpointing crashed (git/swin: upstream's input-grad hook): a defect of this release
        return _row("transformers", version, function, case, hotfix, "crash",
                    f"without checkpointing: {row.get('detail', '')}")
    return _row("transformers", version, function, case, hotfix, "error", f"{result}: {row.get('detail', '')}")


def lab_row(case: str, result: Dict, version: str, hotfix: bool, function: str) -> Dict:
    """A grad_case.py result (tests' vocabulary) as a census row; a builder that cannot import is n/a."""
    status = result.get("status")
    if status == "n/a":
        return _row("transformers", version, function, f"lab/{case}", hotfix, "n/a", f"absent: {result.get('error', '')}")
    verdict = {"equal": "equal", "differs": "wrong", "crash": "crash", "guard": "guard"}.get(status, "error")
    detail = result.get("summary") or result.get("error") or ""
    return _row("transformers", version, function, f"lab/{case}", hotfix, verdict, detail)


def model_type_of(case: str) -> Optional[str]:
    """The transformers model type a case measures (``gemma4+kv_shared_cache/full`` -> ``gemma4``), or None for
    the cases that build no model type of their own (``lab/...``, ``zoo/...``, ``compile/...``)."""
    head = case.split("/")[0]
    return None if head in ("lab", "zoo", "compile") or "/" not in case else head.split("+")[0]


def absent_row(model: str, recipe: str, version: str, hotfix: bool, function: str) -> Dict:
    return _row("transformers", version, function, f"{model}/{recipe}", hotfix, "n/a",
                f"absent: transformers {version} has no model type {model.split('+')[0]}")


def zoo_row(case: str, result: Dict, zoo: str, transformers: str, hotfix: bool) -> Dict:
    """A zoo_cases.py result as a census row (late-offload: did step 1 offload, and are the gradients equal)."""
    if case == "offload":
        steps = result.get("steps") or []
        if not steps:
            return _row("unsloth-zoo", zoo, "unsloth", f"zoo/{case}", hotfix, "error",
                        result.get("error", "no steps"), transformers=transformers)
        counts = [len(step["offloaded"]) if "offloaded" in step else step.get("offloaded_count", 0) for step in steps]
        exact = all(step.get("status") == "equal" for step in steps)
        if not exact:
            verdict = "wrong"
        elif not any(counts):
            verdict = "n/a"  # this release never offloads (before 2025.1.1): nothing can be late
        else:
            verdict = "equal" if counts[0] else "late"
        detail = f"inputs offloaded per step {counts}; gradients {'equal' if exact else 'differ'}"
        return _row("unsloth-zoo", zoo, "unsloth", f"zoo/{case}", hotfix, verdict, detail, transformers=transformers)
    status = result.get("status")
    verdict = {"equal": "equal", "differs": "wrong", "crash": "crash"}.get(status, "error")
    detail = result.get("error") or result.get("summary") or ""
    return _row("unsloth-zoo", zoo, "unsloth", f"zoo/{case}", hotfix, verdict, detail, transformers=transformers)


def compile_row(model: str, backend: str, result: Dict, version: str, hotfix: bool, function: str) -> Dict:
    """A compile_case.py result as a census row, with dynamo's counts."""
    verdict = {"equal": "equal", "differs": "wrong", "crash": "crash", "n/a": "n/a"}.get(result.get("status"), "error")
    if verdict == "wrong":
        detail = f"missing {result.get('missing')}, max relative error {result.get('max_rel', 0):.2g}"
    else:
        detail = result.get("error") or ""
    counts = {key: result[key] for key in COMPILE_COUNTS if key in result}
    return _row("compile", version, function, f"compile/{model}/{backend}", hotfix, verdict, detail, **counts)


def unsupported_row(case: str, version: str, hotfix: bool, function: str, why: str, dimension: str = "transformers") -> Dict:
    """n/a: the checkpoint function cannot run under this torch (unsloth-zoo does not load there)."""
    return _row(dimension, version, function, case, hotfix, "n/a", why)
