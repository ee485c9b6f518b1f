"""patches/transformers_checkpoint_layer_io.py across the transformers release matrix.

Every case runs twice in fresh interpreters of the same release: with
HOTFIX_DISABLE=1 (upstream behaviour: the failure must reproduce, or the test
proves nothing) and with hotfix active through the installed .pth.  "equal"
means every parameter gradient of the reentrant-checkpointed step matches a
step without checkpointing within 1e-6 relative (hotfix.diagnostics.compare).
The upstream half of every release is recorded (tests/evidence/, support/evidence.py:
keyed by the release, torch and the case's code; a quarter of the cells measured
again at each commit, and every one where the key changed); on 5.x the Whisper
case through the default checkpointing is also measured, its loss compared with
the hotfix child's (a float: never recorded).
"""

from __future__ import annotations

import functools
import textwrap
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version as installed

import pytest
from packaging.version import Version

from conftest import CRASH, TRANSFORMERS_WARM, json_lines, matrix_path, matrix_versions, repair_notices, run_python
from support import evidence

CASES = [
    "whisper",
    "whisper-frozen-decoder-embeddings",
    "deberta-v2",
    "layoutlm",
    "custom-layer",
    "custom-layer-nested",
    "custom-layer-positional",  # grad tensors in a positional list (5.x MLCD)
    "pvt-v2",  # nested outputs: each stage returns ((hidden,), height, width)
    "wavlm",  # last: unpatched it trips the memory guard, which ends the child
]

# What upstream does with explicit use_reentrant=True, measured on CPU (torch
# 2.13.0) for each release of tests/matrix.txt: the cases that do NOT give
# no-checkpointing gradients there.  4.52.4 has GradientCheckpointingLayer
# already but no built-in model on it, so only a third-party layer hits the
# keyword bug there.  LayoutLM moved onto the layer class after 4.53; 5.x passes
# Whisper's and LayoutLM's tensors positionally.
_ALL = set(CASES)
_CUSTOM = {"custom-layer", "custom-layer-nested", "custom-layer-positional"}
# pvt-v2 loses 52 of 54 gradients on every release: reentrant checkpointing connects only top-level
# outputs.  On 4.52 its stages are not GradientCheckpointingLayers yet: the encoder calls its checkpoint
# function itself, and hotfix's slot on the encoder's class repairs it there.
UNPATCHED_BROKEN = {
    "4.52.4": _CUSTOM | {"pvt-v2"},
    "4.53.3": _ALL - {"layoutlm"},
    "4.56.2": _ALL,
    "4.57.6": _ALL,
    "5.0.0": _CUSTOM | {"deberta-v2", "wavlm", "pvt-v2"},
    "5.23.0": _CUSTOM | {"deberta-v2", "wavlm", "pvt-v2"},
    "5.24.0": _CUSTOM | {"deberta-v2", "wavlm", "pvt-v2"},  # measured 2026-11-29
}


def _line(version: str) -> str:
    v = Version(version)
    if v < Version("4.53.0"):
        return "4.52"
    return "4.5x" if v.major == 4 else "5.x"


#: Whisper through gradient_checkpointing_enable()'s own default (the seed report's call: reentrant on 4.x,
#: non-reentrant on 5.x), run in the same child as the cases (tools/hotfix_lab/cases/grad_case.py's CASE@default): one
#: interpreter per release and half, not two.  Before wavlm, whose runaway may end an upstream child.
WHISPER_DEFAULT = "whisper@default"


def _cases(version):
    cases = list(CASES)
    if _line(version) != "4.52":  # the releases the Whisper tests below read
        cases.insert(cases.index("wavlm"), WHISPER_DEFAULT)
    return cases


def _run_cases(version, disabled, cases=None):
    args = ["-P", "-m", "hotfix_lab.cases.grad_case"] + (cases or _cases(version))
    # WavLM upstream grows without bound (each layer's recomputation re-walks position_bias's history); a
    # tiny model's step grows by a few MiB, so 256 MiB stops the runaway in ~15 s instead of ~90 s.  One thread:
    # the upstream and the hotfix child of a release run side by side (_both), one core each.
    env = {"GRAD_CASE_RSS_LIMIT": str(256 * 2**20), "OMP_NUM_THREADS": "1"}
    if disabled:
        env["HOTFIX_DISABLE"] = "1"
    proc = run_python(args, env=env, pythonpath=[matrix_path("transformers", version)], timeout=900,
                      warm=TRANSFORMERS_WARM)
    results = {r["case"]: r for r in json_lines(proc.stdout)}
    assert results, proc.stderr[-3000:]
    return results


#: what an upstream half is made of (support/evidence.py adds the lab's infrastructure and the comparison rule)
GUARDS = ("tools/hotfix_lab/cases/grad_case.py", "tests/versions/test_transformers_checkpoint_layer_io.py")


def _facts(results):
    """What a re-measured upstream half must agree on: each case's verdict, and whether it crashed with the seed's
    error (what the tests read of a 4.x line)."""
    return {case: [result["status"], CRASH in result.get("error", "")] for case, result in sorted(results.items())}


def _upstream(version):
    """Upstream's half of a release: recorded (tests/support/evidence.py), whose verdicts the tests read; on 5.x
    the Whisper case through the default checkpointing measured beside it, whose loss the 5.x test compares with
    the hotfix child's (one case in a child of its own, not the nine)."""
    parts = {"transformers": version, "torch": installed("torch"), "cases": _cases(version)}
    results = evidence.upstream("transformers-checkpoint-layer-io", version, parts, GUARDS,
                                lambda: _run_cases(version, True), _facts)
    if _line(version) == "5.x":
        results = dict(results, **_run_cases(version, True, [WHISPER_DEFAULT]))
    return results


@functools.lru_cache(maxsize=None)
def _both(version):
    """(upstream, with hotfix): the two halves of one release (the children at once); once per release for every
    test of this file (pytest-xdist's loadfile keeps a file's tests in one worker)."""
    with ThreadPoolExecutor(2) as pool:
        upstream, fixed = pool.submit(_upstream, version), pool.submit(_run_cases, version, False)
        return upstream.result(), fixed.result()


def _outcome(result):
    return "equal" if result and result["status"] == "equal" else "broken"


@pytest.mark.parametrize("version", matrix_versions("transformers"))
def test_reentrant_checkpointing_gradients(version):
    """Fails upstream as measured; with hotfix every case's gradients equal no-checkpointing."""
    unpatched, patched = _both(version)
    broken = {case for case in CASES if _outcome(unpatched.get(case)) == "broken"}
    assert broken == UNPATCHED_BROKEN[version], {c: unpatched.get(c) for c in CASES}

    for case in CASES:
        result = patched.get(case)
        assert result and result["status"] == "equal", result
        assert result["missing"] == 0 and result["wrong"] == 0 and result["max_error"] <= 1e-6


@pytest.mark.parametrize("version", [v for v in matrix_versions("transformers") if _line(v) == "4.5x"])
def test_whisper_reproduction_error_text(version):
    """The seed report's exact symptom: the error users search for, then fixed."""
    unpatched, patched = (run[WHISPER_DEFAULT] for run in _both(version))
    assert unpatched["status"] == "crash"
    assert "Trying to backward through the graph a second time" in unpatched["error"]
    assert patched["status"] == "equal", patched


@pytest.mark.parametrize("version", [v for v in matrix_versions("transformers") if _line(v) == "5.x"])
def test_whisper_on_5x_trains_exactly_as_upstream(version):
    """5.x defaults to non-reentrant checkpointing: same loss and gradients with or without hotfix."""
    unpatched, patched = (run[WHISPER_DEFAULT] for run in _both(version))
    assert unpatched["status"] == patched["status"] == "equal"
    assert unpatched["loss"] == patched["loss"]


# A GradientCheckpointingLayer that appends to a DynamicCache already holding keys/values that need grad (prefix or
# prompt tuning, a previous segment), handed under a name transformers does not null while checkpointing.
PREFIX_CACHE_CHILD = textwrap.dedent(
    """
    import json, warnings
    import torch
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.cache_utils import DynamicCache
    from transformers.modeling_layers import GradientCheckpointingLayer

    warnings.simplefilter("ignore")

    class Layer(GradientCheckpointingLayer):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(4, 4) for _ in range(3))

        def forward(self, hidden, kv_cache=None):
            keys, values = kv_cache.update(self.k(hidden), self.v(hidden), 0)
            return hidden + torch.softmax(self.q(hidden) @ keys.transpose(-1, -2), dim=-1) @ values

    class Config(PretrainedConfig):
        model_type = "prefix-cache-case"

    class Model(PreTrainedModel):
        config_class = Config
        supports_gradient_checkpointing = True

        def __init__(self):
            super().__init__(Config())
            self.prefix, self.layer = torch.nn.Linear(4, 8), Layer()

        def forward(self, x, prefix_tokens):
            states = self.prefix(prefix_tokens)
            self.cache = DynamicCache()
            self.cache.update(states[..., :4], states[..., 4:], 0)  # 3 positions needing grad
            return self.layer(x, kv_cache=self.cache).pow(2).sum()  # 5 more

    torch.manual_seed(0)
    model = Model().train()
    x, prefix_tokens = torch.randn(1, 5, 4), torch.randn(1, 3, 4)

    def step():
        model.zero_grad(set_to_none=True)
        model(x, prefix_tokens).backward()
        return {name: p.grad for name, p in model.named_parameters()}

    reference = step()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    try:
        grads = step()
    except RuntimeError as exc:
        print(json.dumps({"error": str(exc).splitlines()[0]}))
    else:
        print(json.dumps({
            "missing": sorted(n for n, g in grads.items() if g is None and reference[n] is not None),
            "equal": all(g is not None and torch.allclose(g, reference[n], rtol=1e-6, atol=0)
                         for n, g in grads.items()),
            "positions": model.cache.layers[0].keys.shape[-2],
            "connected": model.cache.layers[0].keys.grad_fn is not None,
        }))
    """
)


@pytest.mark.parametrize("version", ["4.56.2", "5.23.0"])
def test_a_layer_appending_to_a_cache_that_holds_prefix_tensors(version):
    """Upstream: "element 0 of tensors does not require grad" (no positional input needs grad).  Before issue 31
    hotfix said "repaired" while the prefix projection got no gradient and the cache held 13 positions (the
    recomputation appended to the caller's cache again and read it).  Now: every gradient equals the run without
    checkpointing, the cache holds the 8 positions it holds without, connected; and "repaired" is said."""
    path = [matrix_path("transformers", version)]
    upstream = run_python(["-c", PREFIX_CACHE_CHILD], env={"HOTFIX_DISABLE": "1"}, pythonpath=path, timeout=300,
                          warm=TRANSFORMERS_WARM)
    assert json_lines(upstream.stdout) == [{"error": "element 0 of tensors does not require grad and does not have "
                                                     "a grad_fn"}], upstream.stdout + upstream.stderr[-2000:]
    fixed = run_python(["-c", PREFIX_CACHE_CHILD], pythonpath=path, timeout=300, warm=TRANSFORMERS_WARM)
    assert json_lines(fixed.stdout) == [{"missing": [], "equal": True, "positions": 8, "connected": True}], \
        fixed.stdout + fixed.stderr[-2000:]
    assert len(repair_notices(fixed.stderr)) == 1, fixed.stderr[-2000:]


# Layers returning their attention weights beside the hidden states (output_attentions=True): the loss never uses
# the weights, but their producers (query, key) get their gradient through the hidden states anyway.
ATTENTIONS_CHILD = textwrap.dedent(
    """
    import json, warnings
    import torch
    from transformers import (BertConfig, BertForSequenceClassification, WhisperConfig,
                              WhisperForAudioClassification)

    warnings.simplefilter("ignore")

    def bert():
        config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32, max_position_embeddings=16, num_labels=3)
        return BertForSequenceClassification(config), {"input_ids": torch.randint(0, 50, (2, 6)),
                                                       "labels": torch.tensor([0, 2])}

    def whisper():
        config = WhisperConfig(num_mel_bins=8, encoder_layers=2, encoder_attention_heads=2, d_model=16,
                               encoder_ffn_dim=32, max_source_positions=10, num_labels=3)
        return WhisperForAudioClassification(config), {"input_features": torch.randn(2, 8, 20),
                                                       "labels": torch.tensor([1, 0])}

    for name, build in (("bert", bert), ("whisper-audio-classification", whisper)):
        torch.manual_seed(0)
        model, batch = build()
        model.train()

        def step():
            model.zero_grad(set_to_none=True)
            torch.manual_seed(1)  # the same dropout masks in both steps
            out = model(**batch, output_attentions=True)
            assert out.attentions is not None and len(out.attentions) == 2
            out.loss.backward()
            return {n: p.grad for n, p in model.named_parameters()}

        reference = step()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        grads = step()
        print(json.dumps({"model": name, "equal": all(
            (g is None) == (reference[n] is None)
            and (g is None or torch.allclose(g, reference[n], rtol=1e-5, atol=1e-7))
            for n, g in grads.items())}), flush=True)
    """
)


def test_attention_weights_nobody_uses_are_not_claimed_as_repaired():
    """Issue 31 item 5: BERT and WhisperForAudioClassification with output_attentions=True train equal to no
    checkpointing upstream; hotfix used to say "repaired ... a layer output the loss does not use gets no
    gradient" there.  The unused output is still detached in the recomputation, but nothing is claimed: no
    parameter is left without the zero gradient upstream would give it (tests/unit/test_checkpoint_outputs.py
    has the LiLT-style case, where it is said)."""
    path = [matrix_path("transformers", "4.56.2")]
    expected = [{"model": "bert", "equal": True}, {"model": "whisper-audio-classification", "equal": True}]
    upstream = run_python(["-c", ATTENTIONS_CHILD], env={"HOTFIX_DISABLE": "1"}, pythonpath=path, timeout=300,
                          warm=TRANSFORMERS_WARM)
    assert json_lines(upstream.stdout) == expected, upstream.stdout + upstream.stderr[-2000:]
    fixed = run_python(["-c", ATTENTIONS_CHILD], pythonpath=path, timeout=300, warm=TRANSFORMERS_WARM)
    assert json_lines(fixed.stdout) == expected, fixed.stdout + fixed.stderr[-2000:]
    assert repair_notices(fixed.stderr) == [], fixed.stderr[-2000:]
