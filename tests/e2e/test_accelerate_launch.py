"""``accelerate launch`` with HF Trainer, gradient checkpointing on, 2 CPU processes, gloo, loopback.

The training script never mentions hotfix: in every process the ``.pth``
start-up hook activates it on ``import transformers``.  Tiny Whisper,
``Seq2SeqTrainer(gradient_checkpointing=True)`` with the 4.x default
(reentrant) checkpointing, 3 steps; each process writes its own result file.
Upstream (HOTFIX_DISABLE=1) both processes crash with the seed's error; with
hotfix both train 3 steps with the same losses and identical parameters.

``--multi_gpu`` is accelerate's multi-process launcher (torchrun); without a GPU
the processes run as MULTI_CPU with gloo.  ``--cpu`` would start one process
only.  FSDP through accelerate cannot be exercised here: without an
accelerator, ``--use_fsdp`` falls back to MULTI_CPU DDP (measured: the Trainer
wraps the model in DistributedDataParallel), so FSDP is covered by the FSDP2
test in test_distributed.py instead.
"""

from __future__ import annotations

import json
import textwrap

from conftest import CRASH, free_port, run_python


SCRIPT = textwrap.dedent(
    '''
    import json, os, sys
    import torch
    import transformers
    from hotfix_lab.infra import tiny_models

    out = {"rank": int(os.environ.get("RANK", "0")), "hotfix_loaded": "hotfix" in sys.modules}
    try:
        trainer = tiny_models.whisper_trainer()
        trainer.train()
        checksum = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
        out.update(ok=True, steps=trainer.state.global_step, world_size=trainer.args.world_size,
                   distributed=str(trainer.accelerator.distributed_type),
                   wrapper=type(trainer.model_wrapped).__name__,
                   losses=[e["loss"] for e in trainer.state.log_history if "loss" in e], checksum=checksum)
    except Exception as exc:
        out.update(ok=False, error="%s: %s" % (type(exc).__name__, (str(exc).splitlines() or [""])[0][:160]))
    with open(os.path.join(os.environ["RESULT_DIR"], "rank%d.json" % out["rank"]), "w") as f:
        json.dump(out, f)
    '''
)


def launch(folder, disabled):
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(SCRIPT)
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "RESULT_DIR": str(folder)}
    if disabled:
        env["HOTFIX_DISABLE"] = "1"
    proc = run_python(["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
                       "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1",
                       "--main_process_port", str(free_port()), str(script)], env=env, timeout=300)
    results = {}
    for path in sorted(folder.glob("rank*.json")):
        result = json.loads(path.read_text())
        results[result["rank"]] = result
    assert sorted(results) == [0, 1], f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return results


def test_accelerate_launch_ddp_trainer(tmp_path):
    upstream = launch(tmp_path / "upstream", disabled=True)
    fixed = launch(tmp_path / "hotfix", disabled=False)
    for rank in (0, 1):
        assert upstream[rank]["hotfix_loaded"] is False and upstream[rank]["ok"] is False, upstream[rank]
        assert CRASH in upstream[rank]["error"], upstream[rank]
        mine = fixed[rank]
        assert mine["hotfix_loaded"] is True and mine["ok"] is True, mine
        assert mine["steps"] == 3 and mine["world_size"] == 2 and len(mine["losses"]) == 3, mine
        assert mine["distributed"] == "DistributedType.MULTI_CPU" and mine["wrapper"] == "DistributedDataParallel", mine
    assert fixed[0]["losses"] == fixed[1]["losses"], fixed
    assert fixed[0]["checksum"] == fixed[1]["checksum"], fixed
