"""The seed report's flow in small: Seq2SeqTrainer(gradient_checkpointing=True) on Whisper.

Tiny random Whisper, in-memory dataset, 3 steps, CPU, transformers 4.56.2 (the
version in the unsloth seed report).  Upstream crashes at the first backward;
with hotfix installed (the .pth, no change to the script) it trains.
"""

from __future__ import annotations

import json
import textwrap

from conftest import matrix_path, run_python

TRAIN_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from hotfix_lab.infra import tiny_models

    trainer = tiny_models.whisper_trainer(samples=6)
    model = trainer.model
    try:
        trainer.train()
    except Exception as exc:
        print("RESULT", json.dumps({"status": "crash", "error": f"{type(exc).__name__}: {exc}"[:300]}))
        sys.exit(0)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print("RESULT", json.dumps({"status": "trained", "steps": trainer.state.global_step, "losses": losses,
                      "reentrant": model.model.decoder.layers[0]._gradient_checkpointing_func.keywords}))
    """
)


def _train(disabled: bool):
    env = {"HOTFIX_DISABLE": "1"} if disabled else {}
    proc = run_python(["-c", TRAIN_SCRIPT], env=env,
                      pythonpath=[matrix_path("transformers", "4.56.2")], timeout=600)
    # The trainer prints its own log dicts on stdout; ours are marked.
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, proc.stderr[-3000:]
    return results[0]


def test_seq2seq_trainer_whisper_gradient_checkpointing():
    """Crashes upstream with the seed's error; trains 3 finite-loss steps with hotfix."""
    upstream = _train(disabled=True)
    assert upstream["status"] == "crash"
    assert "Trying to backward through the graph a second time" in upstream["error"]

    fixed = _train(disabled=False)
    assert fixed["status"] == "trained", fixed
    assert fixed["steps"] == 3
    assert len(fixed["losses"]) == 3 and all(0 < loss < 100 for loss in fixed["losses"])
    assert fixed["reentrant"] == {"use_reentrant": True}  # the trainer's 4.x default, untouched
