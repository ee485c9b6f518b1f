"""patches/transformers_input_grads_leaf.py: GIT's in-place embeddings after enable_input_require_grads().

Tiny GIT (``GitModel``: ``embeddings += position_embeddings`` right after the
word embeddings), everything frozen but the text layers' query/value weights
(the LoRA situation without peft), one step with checkpointing against one
step without (hotfix.diagnostics.compare, 1e-6 relative).  5.23.0: the script
only turns checkpointing on (which calls ``enable_input_require_grads()``
itself), reentrant and non-reentrant; 4.56.2: the documented PEFT recipe,
``enable_input_require_grads()`` then reentrant checkpointing.  Each release
runs in two fresh interpreters: this patch opted out (HOTFIX_DISABLED_PATCHES;
the other fixes stay active) and hotfix as installed.  The sweep shows the
same for BLIP, BLT and CSM (docs/sweep.md).

The hook's second defect, embeddings that return a tuple: tiny Swin (patch
embeddings return ``(embeddings, output_dimensions)``), frozen but for the
attention's query/value weights, ``enable_input_require_grads()`` then
reentrant checkpointing, 4.56.2 and 5.23.0: upstream raises AttributeError on
the first forward; with hotfix every gradient equals the step without
checkpointing.  The sweep shows the same for Swinv2, Swin2SR, Donut-Swin,
MaskFormer-Swin, Data2Vec-vision, Hiera and TimeSformer.

The fix copies only where needed and says "repaired" only where upstream would have crashed
(issue 31): GIT's "repaired" line names this fix once, and a second step still gets a copy;
Whisper q/v after ``enable_input_require_grads()`` (its decoder embeddings are not changed in
place), three steps where upstream is right (4.56.2 non-reentrant, 5.23.0 reentrant): with
hotfix the first forward hands on one watched copy, the later ones upstream's own leaf, no
"repaired" line, and losses and gradients bit-identical to ``HOTFIX_DISABLE=1``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import TRANSFORMERS_WARM, json_lines, matrix_path, repair_notices, run_python

PATCH = "transformers-input-grads-leaf"
LEAF_ERROR = "a leaf Variable that requires grad is being used in an in-place operation"

CHILD = r"""
import json, sys
import torch, transformers
import hotfix
from hotfix.diagnostics.compare import collect_grads, compare_grads

def tiny_git():
    torch.manual_seed(0)
    vision = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                  image_size=16, patch_size=8)
    config = transformers.GitConfig(vision_config=vision, vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, use_cache=False)
    model = transformers.GitModel(config).train()
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("encoder.layer.") and (".query." in name or ".value." in name))
    batch = {"input_ids": torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(0))}
    return model, batch

def step(model, batch):
    model.zero_grad(set_to_none=True)
    hidden = model(**batch).last_hidden_state
    loss = (hidden * torch.linspace(-1, 1, hidden.shape[-1])).sum()
    loss.backward()
    return float(loss), collect_grads(model)

patch = hotfix.known_patches()["transformers-input-grads-leaf"]
new_line = transformers.__version__.startswith("5.")
for reentrant in ([False, True] if new_line else [True]):  # reentrant last: it ends with revert()
    out = {"reentrant": reentrant, "transformers": transformers.__version__}
    model, batch = tiny_git()
    out["applied"] = patch.applied
    loss, reference = step(model, batch)
    if not new_line:  # 4.x: checkpointing does not call it; the PEFT recipe does
        model.enable_input_require_grads()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    try:
        step(model, batch)  # a second step: the model changes the leaf in place every time, so it still gets a copy
        checked_loss, grads = step(model, batch)
    except RuntimeError as exc:
        print(json.dumps(dict(out, status="crash", error=str(exc)[:200])), flush=True)
        continue
    report = compare_grads(reference, grads, rtol=1e-6)
    out.update(status="equal" if report.ok else "differs", summary=report.summary(), total=report.total,
               missing=len(report.missing), same_loss=checked_loss == loss)
    with torch.no_grad():  # no_grad: upstream's hook alone (a copy made under no_grad would not require grad)
        seen = []
        handle = model.embeddings.word_embeddings.register_forward_hook(lambda m, i, o: seen.append(o.requires_grad))
        model(**batch)
        handle.remove()
        out["no_grad_leaf"] = seen == [True]
    if reentrant:  # revert: the hooks already in the model behave as upstream's again
        out["reverted"] = hotfix.revert()
        try:
            step(model, batch)
            out["after_revert"] = "trains"
        except RuntimeError as exc:
            out["after_revert"] = str(exc)[:200]
        model.disable_input_require_grads()
        out["hooks_left"] = len(model.embeddings.word_embeddings._forward_hooks)
    print(json.dumps(out), flush=True)
"""


TUPLE_CHILD = r"""
import json
import torch, transformers
import hotfix
from hotfix.diagnostics.compare import collect_grads, compare_grads

torch.manual_seed(0)
config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 2], num_heads=[2, 2],
                                 window_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 drop_path_rate=0.0)
model = transformers.SwinModel(config).train()
for name, p in model.named_parameters():  # query/value: 4.x names them query/value, 5.x q_proj/v_proj
    p.requires_grad_(any(k in name for k in (".query.", ".value.", ".q_proj.", ".v_proj.")))
pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))

def step():
    model.zero_grad(set_to_none=True)
    hidden = model(pixel_values=pixels).last_hidden_state
    loss = (hidden * torch.linspace(-1, 1, hidden.shape[-1])).sum()
    loss.backward()
    return collect_grads(model)

out = {"reentrant": True, "transformers": transformers.__version__,
       "applied": hotfix.known_patches()["transformers-input-grads-leaf"].applied}
reference = step()
model.enable_input_require_grads()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
try:
    report = compare_grads(reference, step(), rtol=1e-6)
    out.update(status="equal" if report.ok else "differs", summary=report.summary(), total=report.total,
               missing=len(report.missing))
except Exception as exc:
    out.update(status="crash", error="%s: %s" % (type(exc).__name__, str(exc)[:200]))
print(json.dumps(out), flush=True)
"""


def _run(version, enabled, child=CHILD, notices=None, env=None):
    """The child's JSON lines by ``reentrant``; with ``notices`` (a list), its "repaired" lines appended there."""
    env = dict({"OMP_NUM_THREADS": "1"}, **(env or {}))
    if not enabled:
        env["HOTFIX_DISABLED_PATCHES"] = PATCH
    proc = run_python(["-c", child], env=env, pythonpath=[matrix_path("transformers", version)], timeout=300,
                      warm=TRANSFORMERS_WARM)
    results = {r["reentrant"]: r for r in json_lines(proc.stdout)}
    assert results, proc.stderr[-3000:]
    if notices is not None:
        notices.extend(repair_notices(proc.stderr))
    return results


def _lines_of(notices, fix=PATCH):
    return [line for line in notices if f"; {fix}, " in line]


@pytest.mark.parametrize("version", ["4.56.2", "5.23.0"])
def test_embeddings_changed_in_place_crash_upstream_and_train_exactly_with_hotfix(version):
    notices = {False: [], True: []}
    with ThreadPoolExecutor(2) as pool:
        without, with_patch = pool.map(lambda enabled: _run(version, enabled, notices=notices[enabled]), (False, True))
    reentrant_modes = [True, False] if version.startswith("5.") else [True]
    assert sorted(without) == sorted(with_patch) == sorted(reentrant_modes), (without, with_patch)

    for result in without.values():
        assert not result["applied"], result
        assert result["status"] == "crash" and LEAF_ERROR in result["error"], result

    for result in with_patch.values():
        assert result["applied"] is True, result
        assert result["status"] == "equal", result
        assert result["total"] == 8 and result["missing"] == 0, result  # 2 layers x query, value x weight, bias
        assert result["same_loss"] and result["no_grad_leaf"], result

    # upstream would have crashed: one line, naming this fix (opted out: none)
    assert _lines_of(notices[False]) == [], notices
    said = _lines_of(notices[True])
    assert len(said) == 1 and said[0].startswith("hotfix: repaired a forward of the input embeddings"), notices

    revert = with_patch[True]
    assert PATCH in revert["reverted"], revert
    assert LEAF_ERROR in revert["after_revert"], revert
    assert revert["hooks_left"] == 0, revert  # upstream's handle still removes the wrapped hook


@pytest.mark.parametrize("version", ["4.56.2", "5.23.0"])
def test_embeddings_returning_a_tuple_crash_upstream_and_train_exactly_with_hotfix(version):
    notices = []
    with ThreadPoolExecutor(2) as pool:
        without, with_patch = pool.map(lambda enabled: _run(version, enabled, TUPLE_CHILD, notices if enabled else None)
                                       [True], (False, True))
    assert not without["applied"] and without["status"] == "crash", without
    assert len(_lines_of(notices)) == 1 and "return a tuple" in notices[0], notices
    assert "'tuple' object has no attribute 'requires_grad_'" in without["error"], without
    assert with_patch["applied"] and with_patch["status"] == "equal", with_patch
    assert with_patch["total"] == 12 and with_patch["missing"] == 0, with_patch  # 3 blocks x q, v x weight, bias


# Whisper q/v after enable_input_require_grads(): the hook's leaf is the decoder embeddings' output, which
# Whisper adds its positions to out of place.  An observer hook registered after hotfix's sees what the
# module hands on: a copy (not a leaf) or upstream's own leaf.
QUIET_CHILD = r"""
import hashlib, json
import torch, transformers
from hotfix_lab.infra import tiny_models
import hotfix
from hotfix.diagnostics.compare import collect_grads

new_line = transformers.__version__.startswith("5.")
reentrant = new_line  # where upstream is right: 5.x reentrant, 4.x non-reentrant
model, batch = tiny_models.whisper_qv_only()  # q/v train; enable_input_require_grads()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
handed_on = []
embeddings = model.get_input_embeddings()
embeddings.register_forward_hook(lambda m, i, o: handed_on.append("leaf" if o.is_leaf else "copy"))
digest, losses = hashlib.sha256(), []
for _ in range(3):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    losses.append(loss.item())
    for name, grad in sorted(collect_grads(model).items()):
        digest.update(name.encode() + (b"none" if grad is None else grad.numpy().tobytes()))
print(json.dumps({"reentrant": reentrant, "handed_on": handed_on, "losses": losses, "grads": digest.hexdigest(),
                  "applied": hotfix.known_patches()["transformers-input-grads-leaf"].applied}))
"""


@pytest.mark.parametrize("version", ["4.56.2", "5.23.0"])
def test_embeddings_not_changed_in_place_get_one_watched_copy_then_none_and_no_notice(version):
    notices = []
    with ThreadPoolExecutor(2) as pool:
        upstream, with_hotfix = pool.map(
            lambda enabled: next(iter(_run(version, True, QUIET_CHILD, notices if enabled else None,
                                           env=None if enabled else {"HOTFIX_DISABLE": "1"}).values())),
            (False, True))
    assert upstream["applied"] is False and with_hotfix["applied"] is True, (upstream, with_hotfix)
    assert upstream["handed_on"] == ["leaf"] * 3, upstream
    assert with_hotfix["handed_on"] == ["copy", "leaf", "leaf"], with_hotfix  # watched once, then upstream's leaf
    assert with_hotfix["losses"] == upstream["losses"] and with_hotfix["grads"] == upstream["grads"], (upstream,
                                                                                                      with_hotfix)
    assert _lines_of(notices) == [], notices  # upstream is right here: nothing "repaired" (tests/e2e/test_repair_truth.py: no fix says it)
