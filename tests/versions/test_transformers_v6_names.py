"""transformers v6: the ``activation_checkpointing*`` names first-class, the old names gone (issue 41, part 4).

5.24 deprecates ``gradient_checkpointing_enable`` / ``_disable`` and ``is_gradient_checkpointing`` for removal in
v6; 5.23.0, the matrix's newest, has the same code (the new names, the old ones deferring "until v6"), read
2026-11-28 side by side.  Each child imports transformers 5.23.0 (start-up hook: hotfix active) and, for ``v6``,
simulates v6:
``hotfix.revert()``, the three old names deleted from ``PreTrainedModel`` (and its check for an override of them,
through which 5.24's new names still defer to the old ones "until v6", answering none), ``hotfix.activate()``.  Then:

* every fix's status (hotfix's own data, what ``hotfix status`` renders): the transformers fixes APPLIED;
* hotfix's check (what ``hotfix check-model`` runs) with its ``reentrant`` mode, which now switches checkpointing
  on through ``activation_checkpointing_enable`` (the old name is gone), and through the new API by hand: Whisper
  with only q/v trainable and no input hook (transformers-frozen-inputs) and DeBERTa-v2 (``rel_embeddings=`` by
  keyword: transformers-checkpoint-layer-io): upstream crashes, with hotfix every gradient equal;
* ``v6-setter``: the private setter hotfix reads (``_set_gradient_checkpointing``) gone too: hotfix's fixes on
  transformers' checkpoint function are skipped, their status naming what moved; the import keeps working.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from conftest import TRANSFORMERS_WARM, json_lines, matrix_path, run_python

VERSION = "5.23.0"  # the matrix's newest: the same API as 5.24.0 (its new names defer to the old "until v6")
OLD_NAMES = ("gradient_checkpointing_enable", "gradient_checkpointing_disable", "is_gradient_checkpointing")
SLOT_FIXES = ("transformers-checkpoint-layer-io", "transformers-frozen-inputs", "transformers-ddp-find-unused")
CHILD = r"""
import json, sys, warnings
import torch, transformers
import transformers.modeling_utils as modeling_utils
import hotfix
from hotfix_lab.cases import grad_case
from hotfix_lab.infra import tiny_models
from hotfix.status import fix_statuses

variant, removed = sys.argv[1], sys.argv[2].split(",")
if variant != "as-released":
    hotfix.revert()
    for name in removed + (["_set_gradient_checkpointing"] if variant == "v6-setter" else []):
        delattr(modeling_utils.PreTrainedModel, name)
    # 5.24's new names defer to an override of the old ones "until v6": in v6 there is none to defer to
    modeling_utils.PreTrainedModel._is_overridden = lambda self, name: False
    hotfix.activate()
statuses = {s.name: s.state for s in fix_statuses(hotfix.registry)}
print(json.dumps({"case": "status", "statuses": statuses, "transformers": transformers.__version__,
                  "old_names": [n for n in removed if hasattr(modeling_utils.PreTrainedModel, n)]}), flush=True)
if variant == "v6-setter":
    sys.exit(0)
from hotfix.diagnostics.checker import check_model
new_api = ("activation_checkpointing_enable", lambda m: m.activation_checkpointing_enable(
    activation_checkpointing_kwargs={"use_reentrant": True}))
for name, builder in (("whisper-qv-no-hook", tiny_models.whisper_qv_only_no_hook), ("deberta-v2", tiny_models.deberta_v2)):
    for mode in ("reentrant", new_api):
        model, batch = builder()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = check_model(model, batch, modes=[mode], cut="raise")  # check-model's engine
        label = mode if isinstance(mode, str) else mode[0]
        print(json.dumps(grad_case.case_result(report, {
            "case": f"{name}:{label}", "deprecated": sorted({str(w.message)[:60] for w in caught
                                                             if issubclass(w.category, FutureWarning)})})), flush=True)
"""


def _run(variant, disabled=False):
    env = {"OMP_NUM_THREADS": "1", **({"HOTFIX_DISABLE": "1"} if disabled else {})}
    proc = run_python(["-c", CHILD, variant, ",".join(OLD_NAMES)], env=env,
                      pythonpath=[matrix_path("transformers", VERSION)], timeout=400, warm=TRANSFORMERS_WARM)
    results = {r["case"]: r for r in json_lines(proc.stdout)}
    assert "status" in results, proc.stderr[-3000:]
    return results


def test_v6_names_every_fix_applies_status_and_check_tell_the_truth():
    with ThreadPoolExecutor(2) as pool:
        upstream, v6, today, setter = pool.map(lambda args: _run(*args), [("v6", True), ("v6",), ("as-released",),
                                                                         ("v6-setter",)])
    assert v6["status"]["transformers"] == VERSION and v6["status"]["old_names"] == []
    assert today["status"]["old_names"] == list(OLD_NAMES)  # 5.23 / 5.24 still have them (deprecated)
    for results in (v6, today):
        for fix in SLOT_FIXES + ("transformers-input-grads-leaf",):
            assert results["status"]["statuses"][fix].startswith("APPLIED to transformers.modeling_utils"), \
                results["status"]["statuses"]
    for case in ("whisper-qv-no-hook:reentrant", "whisper-qv-no-hook:activation_checkpointing_enable",
                 "deberta-v2:reentrant", "deberta-v2:activation_checkpointing_enable"):
        assert upstream[case]["status"] == "crash", upstream[case]
        assert v6[case]["status"] == "equal", v6[case]
        assert today[case]["status"] == "equal", today[case]
        # check-model's own mode uses the first-class name: no deprecation warning from it
        assert not any("gradient_checkpointing_enable" in w for w in today[case]["deprecated"]), today[case]
    # the private setter hotfix reads gone as well: the fixes on it are skipped and say what moved
    for fix in SLOT_FIXES:
        state = setter["status"]["statuses"][fix]
        assert state.startswith("skipped, target changed") and "_set_gradient_checkpointing is missing" in state, state
