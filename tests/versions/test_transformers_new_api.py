"""transformers' new checkpointing API on 5.23.0: ``activation_checkpointing_enable``.

5.17 added ``activation_checkpointing_enable(activation_checkpointing_kwargs=...,
every_n_layers=..., offload=...)`` and 5.23 marks ``gradient_checkpointing_enable``
deprecated.  Both end in ``_set_gradient_checkpointing`` storing a checkpoint
function on each module, which is where hotfix's fixes act, so they apply
through the new API unchanged.  Each case: one step against a step without
checkpointing, with HOTFIX_DISABLE=1 and with hotfix:

* DeBERTa-v2 with ``norm_rel_ebd="layer_norm"`` (``rel_embeddings=`` by keyword) and
  ``use_reentrant=True``, every layer or ``every_n_layers=2``: upstream crashes,
  hotfix trains (transformers-checkpoint-layer-io);
* the new API's default (non-reentrant): upstream correct, hotfix changes nothing;
* Whisper, only q/v trainable, no ``enable_input_require_grads()``, ``use_reentrant=True``:
  upstream crashes, hotfix trains (transformers-frozen-inputs);
* WavLM (``position_bias=`` by keyword), ``use_reentrant=True``: hotfix trains (upstream
  re-walks the graph without bound, as on 4.x; not run here);
* ``offload=True`` cannot run on a CPU-only torch: transformers 5.23 asks for pinned memory
  even without an accelerator ("pin_memory=True requires a CUDA or other accelerator
  backend"), with or without hotfix; the GPU kit runs offload on CUDA (docs/gpu.md).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from conftest import TRANSFORMERS_WARM, json_lines, matrix_path, run_python

VERSION = "5.23.0"
CHILD = r"""
import json, sys
import torch, transformers
from hotfix_lab.cases import grad_case
from hotfix_lab.infra import tiny_models
from hotfix.diagnostics.checker import check_model
builders = {"deberta-v2": tiny_models.deberta_v2, "wavlm": tiny_models.wavlm,
            "whisper-qv-no-hook": tiny_models.whisper_qv_only_no_hook}
for spec in sys.argv[1:]:
    name, reentrant, offload, every = spec.split(":")
    model, batch = builders[name]()
    new_api = ("activation_checkpointing_enable", lambda m: m.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": reentrant == "1"}, every_n_layers=int(every),
        offload=offload == "1"))
    report = check_model(model, batch, modes=[new_api], cut="raise")  # hotfix's comparison engine
    print(json.dumps(grad_case.case_result(report, {"case": spec, "transformers": transformers.__version__})),
          flush=True)
"""

# case -> (upstream status or None when not run upstream, status with hotfix, error text upstream)
CASES = {
    "deberta-v2:1:0:1": ("crash", "equal", "backward through the graph a second time"),
    "deberta-v2:1:0:2": ("crash", "equal", "backward through the graph a second time"),
    "deberta-v2:0:0:1": ("equal", "equal", None),
    "whisper-qv-no-hook:1:0:1": ("crash", "equal", "does not require grad"),
    "wavlm:1:0:1": (None, "equal", None),
    "deberta-v2:1:1:1": ("crash", "crash", "pin_memory=True requires"),
}


def _run(disabled):
    cases = [c for c, (upstream, _, _) in CASES.items() if not disabled or upstream is not None]
    env = {"OMP_NUM_THREADS": "1", **({"HOTFIX_DISABLE": "1"} if disabled else {})}
    proc = run_python(["-c", CHILD, *cases], env=env, pythonpath=[matrix_path("transformers", VERSION)], timeout=400,
                      warm=TRANSFORMERS_WARM)
    results = {r["case"]: r for r in json_lines(proc.stdout)}
    assert set(results) == set(cases), proc.stderr[-3000:]
    return results


def test_fixes_apply_through_activation_checkpointing_enable():
    with ThreadPoolExecutor(2) as pool:
        without, with_hotfix = pool.map(_run, (True, False))
    for case, (upstream, fixed, error) in CASES.items():
        assert with_hotfix[case]["transformers"] == VERSION
        assert with_hotfix[case]["status"] == fixed, with_hotfix[case]
        if upstream is not None:
            assert without[case]["status"] == upstream, without[case]
        if error is not None:
            assert error in without[case]["error"], without[case]
    # nothing to repair: with hotfix the step is upstream's exactly
    assert with_hotfix["deberta-v2:0:0:1"]["loss"] == without["deberta-v2:0:0:1"]["loss"]


NO_ALIAS_WARNING = r"""
import json, warnings
import torch, transformers
from hotfix_lab.infra import tiny_models
from hotfix.diagnostics.compare import collect_grads, compare_grads
model, batch = tiny_models.whisper(0)
model(**batch).loss.backward(); reference = collect_grads(model); model.zero_grad(set_to_none=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
alias = [str(w.message) for w in caught if "gradient_checkpointing_enable" in str(w.message)]
model(**batch).loss.backward()
print(json.dumps({"transformers": transformers.__version__, "alias_warnings": alias,
                  "equal": compare_grads(reference, collect_grads(model)).ok}))
"""


def test_activation_checkpointing_enable_says_nothing_of_the_deprecated_alias():
    """transformers 5.24 calls the deprecated ``gradient_checkpointing_enable`` from ``activation_checkpointing_enable``
    where a model overrides it, by identity (``__func__ is not PreTrainedModel.gradient_checkpointing_enable``).
    hotfix's wrapper there made every model look overridden: each ``activation_checkpointing_enable()`` printed
    "gradient_checkpointing_enable is deprecated" (a crash under ``-W error::FutureWarning``).  Now the alias is
    left unwrapped (it calls the wrapped new method), no warning, and Whisper still trains equal."""
    proc = run_python(["-c", NO_ALIAS_WARNING], pythonpath=[matrix_path("transformers", "5.24.0")], timeout=300,
                      warm=TRANSFORMERS_WARM)
    (seen,) = json_lines(proc.stdout)
    assert seen == {"transformers": "5.24.0", "alias_warnings": [], "equal": True}, proc.stderr[-3000:]
