"""The seed report's flow on a real GPU: unsloth FastModel Whisper, LoRA on q/v,
use_gradient_checkpointing="unsloth", a few steps.

NOT RUN in CI or on the machines this was written on (no GPU there): it skips
cleanly without CUDA or without an importable ``unsloth``.  Needs, in the
test venv: a CUDA torch, unsloth (+ unsloth_zoo), peft; hotfix from the wheel.

Model: a tiny random Whisper (config below) saved to a temporary directory
and loaded with ``FastModel.from_pretrained(<that dir>)``, so nothing is
downloaded.  If unsloth's loader refuses a local random checkpoint (it may
want a processor/tokenizer), the test skips with the loader's error; set
HOTFIX_GPU_WHISPER_MODEL to a hub id (e.g. ``unsloth/whisper-large-v3``, a
download of several GB) or a local path to run the same flow on a real model.

Checks, each in a fresh interpreter:
* unsloth run: no crash in 3 steps (the seed's "backward through the graph a
  second time"), "Unsloth: Will smartly offload gradients to save VRAM!"
  printed exactly once and during step 1, finite losses, hotfix patches applied;
* baseline run: the same model with plain transformers + PEFT and
  non-reentrant checkpointing (no unsloth imported, so its swap of torch's
  checkpoint cannot interfere);
* the unsloth run's peak CUDA memory during training is lower than the
  baseline's (the offloaded layer inputs are not on the GPU).
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch

from conftest import json_lines, run_python

try:  # importable check only; the flows run in child interpreters
    import importlib.util

    HAVE_UNSLOTH = importlib.util.find_spec("unsloth") is not None
except Exception:  # pragma: no cover
    HAVE_UNSLOTH = False

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(not HAVE_UNSLOTH, reason="needs unsloth installed in the test venv"),
]

OFFLOAD_MESSAGE = "Unsloth: Will smartly offload gradients to save VRAM!"
STEPS = 3

# Big enough that each checkpointed layer input (batch x 1500 x d_model x 2 B =
# 12 MiB in the encoder) is above unsloth's 2 MiB offload threshold.
CONFIG = dict(vocab_size=1000, num_mel_bins=80, encoder_layers=6, decoder_layers=6, encoder_attention_heads=4,
              decoder_attention_heads=4, d_model=256, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
              max_source_positions=1500, max_target_positions=448, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, decoder_start_token_id=1)
BATCH, LABEL_LEN = 16, 64

COMMON = """
import json, math, sys, torch
BATCH, LABEL_LEN, STEPS = {batch}, {label_len}, {steps}

def batch(device, dtype):
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(BATCH, 80, 3000, generator=g).to(device, dtype)
    labels = torch.randint(3, 1000, (BATCH, LABEL_LEN), generator=g).to(device)
    return feats, labels

def train(model):
    model.train()
    feats, labels = batch("cuda", torch.bfloat16)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    losses = []
    for step in range(1, STEPS + 1):
        print(f"HOTFIX-STEP {{step}} begin", flush=True)
        loss = model(input_features=feats, labels=labels).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        losses.append(float(loss))
        print(f"HOTFIX-STEP {{step}} end", flush=True)
    return losses, torch.cuda.max_memory_allocated()
"""

UNSLOTH_FLOW = """
import unsloth  # first: unsloth wants to patch before transformers loads
from unsloth import FastModel
from transformers import WhisperForConditionalGeneration
try:
    model, _ = FastModel.from_pretrained(model_name=sys.argv[1], dtype=torch.bfloat16, load_in_4bit=False,
                                         auto_model=WhisperForConditionalGeneration)
except Exception as exc:
    print(json.dumps(dict(skip=f"FastModel could not load {{sys.argv[1]}}: {{type(exc).__name__}}: {{exc}}")))
    sys.exit(0)
model = FastModel.get_peft_model(model, r=8, lora_alpha=8, lora_dropout=0, bias="none",
                                 target_modules=["q_proj", "v_proj"], use_gradient_checkpointing="unsloth",
                                 random_state=3407, task_type=None)
losses, peak = train(model)
from hotfix.registry import registry
applied = sorted(name for name, p in registry.patches().items() if p.applied)
print(json.dumps(dict(losses=losses, peak=peak, applied=applied)))
"""

BASELINE_FLOW = """
from peft import LoraConfig, get_peft_model
from transformers import WhisperForConditionalGeneration
model = WhisperForConditionalGeneration.from_pretrained(sys.argv[1], torch_dtype=torch.bfloat16).cuda()
model.config.use_cache = False
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{"use_reentrant": False}})
model.enable_input_require_grads()
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=8, lora_dropout=0.0, bias="none",
                                         target_modules=["q_proj", "v_proj"]))
losses, peak = train(model)
print(json.dumps(dict(losses=losses, peak=peak)))
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    name = os.environ.get("HOTFIX_GPU_WHISPER_MODEL")
    if name:
        return name
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-whisper")
    WhisperForConditionalGeneration(WhisperConfig(**CONFIG)).save_pretrained(path)
    return str(path)


def _flow(tmp_path, body, model, name):
    script = tmp_path / f"{name}.py"
    common = COMMON.format(batch=BATCH, label_len=LABEL_LEN, steps=STEPS)
    script.write_text(textwrap.dedent(common) + textwrap.dedent(body.format()))
    proc = run_python([str(script), model], timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json_lines(proc.stdout)
    assert results, proc.stdout[-3000:] + proc.stderr[-5000:]
    return results[-1], proc.stdout


def test_unsloth_whisper_lora_trains_offloads_and_saves_memory(tmp_path, model_dir):
    result, stdout = _flow(tmp_path, UNSLOTH_FLOW, model_dir, "unsloth_flow")
    if "skip" in result:
        pytest.skip(result["skip"] + " (set HOTFIX_GPU_WHISPER_MODEL to a loadable Whisper)")
    assert len(result["losses"]) == STEPS and all(map(lambda x: x == x and abs(x) < 1e4, result["losses"]))
    assert "unsloth-zoo-closure-tensors" in result["applied"]

    # the offload message: once, and already during step 1
    assert stdout.count(OFFLOAD_MESSAGE) == 1, stdout[-3000:]
    step1 = stdout[stdout.index("HOTFIX-STEP 1 begin"):stdout.index("HOTFIX-STEP 1 end")]
    assert OFFLOAD_MESSAGE in step1

    baseline, _ = _flow(tmp_path, BASELINE_FLOW, model_dir, "baseline_flow")
    assert result["peak"] < baseline["peak"], json.dumps(dict(unsloth=result["peak"], baseline=baseline["peak"]))
