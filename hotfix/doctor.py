"""``hotfix doctor``: reproduce the Whisper checkpointing bug here, with and without hotfix.

Each run happens in a fresh interpreter (``python -m hotfix.doctor --child``)
so the unpatched run is really unpatched: it gets ``HOTFIX_DISABLE=1``, which
stops both ``import hotfix`` and the ``.pth`` auto-activation.  The model is a
tiny random-weight Whisper built from a config: no download, a few seconds on
a CPU.  Gradients of the checkpointed step are compared with a step without
checkpointing on the same weights and batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List

# (case name, what it shows)
CASES = (
    ("whisper", "tiny Whisper, gradient_checkpointing_enable() with its defaults"),
    ("whisper-frozen-decoder-embeddings", "same, decoder embeddings frozen (silent gradient loss)"),
)


def tiny_whisper(seed: int = 0, frozen_decoder_embeddings: bool = False):
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=100, num_mel_bins=8, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, d_model=16,
        encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=10,
        max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1,
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).train()
    if frozen_decoder_embeddings:
        model.model.decoder.embed_tokens.requires_grad_(False)
        model.model.decoder.embed_positions.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed + 1)
    batch = {
        "input_features": torch.randn(2, 8, 20, generator=generator),
        "labels": torch.randint(3, 100, (2, 5), generator=generator),
    }
    return model, batch


def _step(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return float(loss.detach())  # float() of a tensor that requires grad warns (an error under -W error)


def run_case(case: str) -> Dict:
    """One case in this interpreter: reference step, then checkpointed step."""
    import torch
    import transformers

    from hotfix.gradcheck import collect_grads, compare_grads

    model, batch = tiny_whisper(frozen_decoder_embeddings=(case != "whisper"))
    from hotfix.registry import registry

    result = {"case": case, "transformers": transformers.__version__, "torch": torch.__version__,
              "hotfix_active": registry.active}
    _step(model, batch)
    reference = collect_grads(model)
    model.gradient_checkpointing_enable()
    try:
        result["loss"] = _step(model, batch)
    except Exception as exc:
        first_sentence = str(exc).splitlines()[0].split(" (")[0].split(". ")[0]
        result.update(status="crash", error=f"{type(exc).__name__}: {first_sentence}")
        return result
    report = compare_grads(reference, collect_grads(model))
    result.update(status="trains" if report.ok else "wrong-gradients", summary=report.summary(),
                  max_error=report.max_error, missing=len(report.missing), wrong=len(report.wrong))
    return result


def _child_main(cases: List[str]) -> int:
    # Running as `python -m hotfix.doctor` imported the hotfix package, which
    # activated it unless HOTFIX_DISABLE is set: exactly a user's `import hotfix`.
    for case in cases:
        print(json.dumps(run_case(case)), flush=True)
    return 0


def _run_child(disabled: bool) -> List[Dict]:
    env = dict(os.environ)
    env.pop("HOTFIX_DISABLE", None)
    if disabled:
        env["HOTFIX_DISABLE"] = "1"
    # cwd is a temporary folder: `python -m` puts cwd first on sys.path, and
    # run from a source checkout it would import the uninstalled tree instead
    # of the hotfix the user installed.
    proc = subprocess.run(
        [sys.executable, "-m", "hotfix.doctor", "--child"] + [c for c, _ in CASES],
        env=env, capture_output=True, text=True, timeout=600, cwd=tempfile.gettempdir(),
    )
    for line in proc.stderr.splitlines():
        # hotfix's problem lines matter here; its "repaired" notice is what the table shows anyway.
        if line.startswith("hotfix:") and not line.startswith("hotfix: repaired a checkpointed call"):
            print(f"  [{'without' if disabled else 'with'} hotfix] {line}")
    results = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            results.append(json.loads(line))
    if not results:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        results = [{"case": c, "status": "error", "error": tail[0]} for c, _ in CASES]
    return results


def _describe(result: Dict) -> str:
    status = result.get("status")
    if status == "crash":
        return f"CRASH   {result['error']}"
    if status == "error":
        return f"ERROR   {result['error']}"
    label = "TRAINS " if status == "trains" else "WRONG  "
    return f"{label} loss {result['loss']:.4f}; {result['summary']}"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return _child_main(argv[1:])
    try:
        import transformers  # noqa: F401
    except Exception as exc:
        print(f"hotfix doctor: transformers cannot be imported here ({exc!r}); nothing to check.")
        return 2
    print("hotfix doctor: tiny random-weight Whisper (2+2 layers, d_model 16) on CPU, one training step,")
    print("gradients compared with the same step without checkpointing.\n")
    without = _run_child(disabled=True)
    with_fix = _run_child(disabled=False)
    if without and "transformers" in without[0]:
        print(f"transformers {without[0]['transformers']}, torch {without[0]['torch']}\n")
    healthy = True
    for (case, what), before, after in zip(CASES, without, with_fix):
        print(f"{case}: {what}")
        print(f"  without hotfix (HOTFIX_DISABLE=1): {_describe(before)}")
        print(f"  with hotfix:                       {_describe(after)}")
        healthy = healthy and after.get("status") == "trains"
    broken_before = any(r.get("status") != "trains" for r in without)
    print()
    if healthy and broken_before:
        print("verdict: this environment has the bug, and hotfix fixes it.")
    elif healthy:
        print("verdict: checkpointing already works here without hotfix; hotfix changes nothing.")
    else:
        print("verdict: checkpointing is still broken with hotfix here; please report it with `hotfix status`.")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
