"""A model with checkpointing enabled copies, pickles and saves exactly as without hotfix.

hotfix used to store a wrapt wrapper in every checkpointing module's
``__dict__``: ``copy.deepcopy`` and ``pickle`` then raised ("object proxy must
define __deepcopy__()/__reduce__()"), ``torch.save`` truncated an existing
checkpoint to a few hundred bytes, EMA (``AveragedModel``) and spawn workers
failed.  Now both transformers fixes sit on classes
(``hotfix.checkpointing.slot``): the model holds only what transformers stored.

Per checkpointing mode (reentrant, non-reentrant) and model (full Whisper:
checkpoint-layer-io fix; Whisper with only q/v trainable and nothing else needing
grad: frozen-inputs fix), one child interpreter makes every kind of copy, and
each copy trains with the gradients of a step without checkpointing.
"""

from __future__ import annotations

import pytest

from conftest import json_lines, run_python

WORKER = '''
import torch

def train_copy(model, batch, path):
    """Runs in a spawned process: one step on the unpickled model, gradients saved."""
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    torch.save({n: p.grad for n, p in model.named_parameters() if p.requires_grad}, path)
'''

CHILD = r'''
import copy, io, json, os, pickle, sys
import torch
import copy_worker
from hotfix_lab.infra import tiny_models
from hotfix_lab.infra import standalone
compare = standalone.load("compare")  # hotfix's comparison rule (None never equals zero), without importing hotfix
from torch.optim.swa_utils import AveragedModel

mode, which, scratch = sys.argv[1], sys.argv[2], sys.argv[3]
model, batch = tiny_models.whisper(0)
if which == "qv-only":  # LoRA-like: only attention q/v train, no input needs grad
    for name, p in model.named_parameters():
        p.requires_grad_(name.split(".")[-2] in ("q_proj", "v_proj"))

def step(m):
    m.zero_grad(set_to_none=True)
    try:
        m(**batch).loss.backward()
    except Exception as exc:
        return compare.short_error(exc)
    return compare.compare_grads(reference, compare.collect_grads(m)).ok

model.zero_grad(set_to_none=True); model(**batch).loss.backward(); reference = compare.collect_grads(model)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": mode == "reentrant"})
out = {"mode": mode, "model": which, "none_in_reference": sum(g is None for g in reference.values())}

def attempt(name, make):
    try:
        out[name] = step(make())
    except Exception as exc:
        out[name] = compare.short_error(exc)

attempt("original", lambda: model)
attempt("deepcopy", lambda: copy.deepcopy(model))
data = pickle.dumps(model)
out["pickle_mentions_hotfix"] = b"hotfix" in data
attempt("pickle", lambda: pickle.loads(data))
attempt("ema", lambda: AveragedModel(model).module)

# torch.save over an existing good checkpoint: the file is complete afterwards.
path = os.path.join(scratch, "model.pt")
torch.save(model.state_dict(), path)
before = os.path.getsize(path)
torch.save(model, path)
out["saved_bytes_grew"] = os.path.getsize(path) > before
attempt("torch_load", lambda: torch.load(path, weights_only=False))

# spawn: the model travels pickled into a fresh interpreter (whose .pth activates hotfix).
import multiprocessing as mp
grads_path = os.path.join(scratch, "spawn_grads.pt")
worker = mp.get_context("spawn").Process(target=copy_worker.train_copy, args=(model, batch, grads_path))
worker.start(); worker.join(240)
out["spawn"] = worker.exitcode == 0 and compare.compare_grads(reference, torch.load(grads_path)).ok
with open(os.path.join(scratch, "pickled_model.bin"), "wb") as handle:
    handle.write(data)
print(json.dumps(out), flush=True)
'''

# Unpickling where hotfix is not installed: a `hotfix` package that cannot be
# imported stands first on sys.path, and the start-up hook is off.
LOAD_WITHOUT_HOTFIX = r'''
import json, pickle, sys
import torch
with open(sys.argv[1], "rb") as handle:
    model = pickle.load(handle)
print(json.dumps({"loaded": type(model).__name__, "hotfix_modules": sorted(m for m in sys.modules if m.startswith("hotfix") and not m.startswith("hotfix_lab"))}))
'''


@pytest.fixture(scope="module")
def worker_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("copy_worker")
    (folder / "copy_worker.py").write_text(WORKER)
    blocker = folder / "blocker" / "hotfix"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('hotfix is not installed here')\n")
    return folder


@pytest.mark.parametrize("which", ["full", "qv-only"])
@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_copies_pickles_saves_and_spawn_train_like_the_original(mode, which, worker_dir, tmp_path):
    proc = run_python(["-c", CHILD, mode, which, str(tmp_path)], env={"OMP_NUM_THREADS": "1"},
                      pythonpath=[worker_dir], timeout=400)
    results = json_lines(proc.stdout)
    assert results, proc.stderr[-3000:]
    seen = results[0]
    assert seen["none_in_reference"] == 0, seen  # every trainable parameter has a reference gradient
    for kind in ("original", "deepcopy", "pickle", "ema", "torch_load", "spawn"):
        assert seen[kind] is True, (kind, seen, proc.stderr[-2000:])
    assert seen["pickle_mentions_hotfix"] is False, seen
    assert seen["saved_bytes_grew"] is True, seen

    # The pickle loads where hotfix cannot be imported at all.
    loaded = run_python(["-c", LOAD_WITHOUT_HOTFIX, str(tmp_path / "pickled_model.bin")],
                        env={"HOTFIX_DISABLE": "1"}, pythonpath=[worker_dir / "blocker"], timeout=120)
    assert json_lines(loaded.stdout) == [{"loaded": "WhisperForConditionalGeneration", "hotfix_modules": []}], \
        loaded.stderr[-2000:]
