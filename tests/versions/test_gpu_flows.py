"""Issue 12's flows that need an accelerator, on a real GPU (marker ``gpu``; run by scripts/gpu/run).

Not yet run: written on a CPU-only machine; the GPU kit's next run is their first (docs/gpu.md).

* ``accelerate launch --use_fsdp`` (one process, CUDA) with HF ``Seq2SeqTrainer``, gradient
  checkpointing on with the 4.x default (reentrant), transformers 4.56.2 (HOTFIX_GPU_TRANSFORMERS,
  installed by the kit), a script that never mentions hotfix: upstream (HOTFIX_DISABLE=1) crashes
  with the seed's error; with hotfix it trains 3 steps under FSDP.  On CPU accelerate falls back to
  DDP (tests/e2e/test_accelerate_launch.py), which is why this lives here.
* transformers' new API with ``offload=True`` (the image's transformers, 5.17 or later), on CUDA,
  ``use_reentrant=True``: DeBERTa-v2 (``norm_rel_ebd="layer_norm"``) crashes upstream and trains with
  hotfix; WavLM trains with hotfix; every gradient equal to a step without checkpointing.  A
  CPU-only torch cannot run offload at all (tests/versions/test_transformers_new_api.py).
"""

from __future__ import annotations

import json
import os
import socket
import textwrap

import pytest

from conftest import CRASH, LAB, SUPPORT, json_lines, run_python

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


TRAIN = textwrap.dedent(
    '''
    import json, os, sys
    import tiny_models

    out = {"hotfix_loaded": "hotfix" in sys.modules}
    try:
        trainer = tiny_models.whisper_trainer(use_cpu=False)
        trainer.train()
        out.update(ok=True, steps=trainer.state.global_step, distributed=str(trainer.accelerator.distributed_type),
                   wrapper=type(trainer.model_wrapped).__name__,
                   losses=[e["loss"] for e in trainer.state.log_history if "loss" in e])
    except Exception as exc:
        out.update(ok=False, error="%s: %s" % (type(exc).__name__, (str(exc).splitlines() or [""])[0][:160]))
    with open(os.path.join(os.environ["RESULT_DIR"], "result.json"), "w") as f:
        json.dump(out, f)
    '''
)

NEW_API = r"""
import json, sys
import torch, transformers
import grad_case, tiny_models
from hotfix.diagnostics.checker import check_model
for name in sys.argv[1:]:
    model, batch = getattr(tiny_models, name)()
    model, batch = model.cuda(), {k: v.cuda() for k, v in batch.items()}
    new_api = ("activation_checkpointing_enable(offload=True)", lambda m: m.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": True}, offload=True))
    report = check_model(model, batch, modes=[new_api], cut="raise")
    print(json.dumps(grad_case.case_result(report, {"case": name, "transformers": transformers.__version__})),
          flush=True)
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fsdp_train(folder, disabled):
    transformers_dir = os.environ.get("HOTFIX_GPU_TRANSFORMERS")
    if not transformers_dir:
        pytest.skip("HOTFIX_GPU_TRANSFORMERS unset: run through scripts/gpu/run")
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(TRAIN)
    env = {"RESULT_DIR": str(folder), "TOKENIZERS_PARALLELISM": "false", **({"HOTFIX_DISABLE": "1"} if disabled else {})}
    proc = run_python(["-m", "accelerate.commands.launch", "--use_fsdp", "--num_processes", "1", "--num_machines", "1",
                       "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
                       str(script)], env=env, pythonpath=[transformers_dir, LAB, SUPPORT], timeout=150)
    result = folder / "result.json"
    assert result.exists(), f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(result.read_text())


def test_accelerate_fsdp_trainer_on_cuda(tmp_path):
    upstream = _fsdp_train(tmp_path / "upstream", disabled=True)
    fixed = _fsdp_train(tmp_path / "hotfix", disabled=False)
    assert upstream["hotfix_loaded"] is False and upstream["ok"] is False and CRASH in upstream["error"], upstream
    assert fixed["hotfix_loaded"] is True and fixed["ok"] is True, fixed
    assert fixed["steps"] == 3 and len(fixed["losses"]) == 3, fixed
    assert "FSDP" in fixed["distributed"], fixed


def test_new_api_with_offload_on_cuda():
    cases = ["deberta_v2", "wavlm"]
    if not hasattr(__import__("transformers").PreTrainedModel, "activation_checkpointing_enable"):
        pytest.skip("this transformers has no activation_checkpointing_enable (5.17+)")
    results = {}
    for disabled in (True, False):
        proc = run_python(["-c", NEW_API, *(["deberta_v2"] if disabled else cases)],
                          env={"HOTFIX_DISABLE": "1"} if disabled else {}, pythonpath=[LAB, SUPPORT], timeout=150)
        results[disabled] = {r["case"]: r for r in json_lines(proc.stdout)}
        assert results[disabled], proc.stderr[-3000:]
    assert results[True]["deberta_v2"]["status"] == "crash" and CRASH in results[True]["deberta_v2"]["error"]
    for case in cases:
        fixed = results[False][case]
        assert fixed["status"] == "equal" and fixed["missing"] == 0 and fixed["wrong"] == 0, fixed
