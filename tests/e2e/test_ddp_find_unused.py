"""transformers-ddp-find-unused: DDP(find_unused_parameters=True) with reentrant checkpointing, 2 ranks.

``torchrun --nproc_per_node 2``, gloo, CPU, loopback only, transformers 4.56.2, with the rank script
tools/hotfix_lab/cases/ddp_cases.py, which never mentions hotfix: one launch without hotfix (HOTFIX_DISABLE=1), one
with it (the start-up hook), run side by side, each running every case in one process group.  A
plain-loop case trains the same model with and without checkpointing, both in
``DistributedDataParallel(find_unused_parameters=True)``, each rank on its half of one batch, and
compares every trainable parameter's all-reduced gradient (a missing gradient never equals a zero
one).  Cases: PEFT LoRA and full fine-tuning of a tiny Llama; a trainable parameter inside a
checkpointed layer and a module outside that the forward never uses; gradient accumulation
(``no_sync``); ``static_graph=True``; Whisper + LoRA without the input hook (the other transformers
fixes act on the same calls); unsloth-zoo's ``UnslothCheckpointFunction`` (2026.10.9, on CPU, with
unsloth's own swap); LlamaFactory's (0.9.5: ``use_unsloth_gc`` and its default) and axolotl's (0.21.0: ``offload``)
checkpoint functions, turned on as each fork does (code only, loaded on CPU: hotfix_lab.infra.fork_loader; their calls go
through transformers' checkpoint function); transformers' Trainer over the LoRA model, which picks
``find_unused_parameters=True`` for a PEFT model itself (3 steps against the same Trainer without
checkpointing: losses and LoRA weights).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import MATRIX, launch_ranks, matrix_path, repair_notices

FIND_UNUSED = "Expected to mark a variable ready only once"
ZOO = "2026.10.9"  # the latest release the matrix holds: its own backward returns every input's gradient
#: the forks' checkpoint functions, turned on as each fork does (hotfix_lab.infra.fork_loader): LlamaFactory's before
#: unsloth's swap (its default wraps torch's checkpoint), axolotl's last (it replaces transformers' checkpoint)
FORKS = {"llamafactory": "0.9.5", "axolotl": "0.21.0"}
FORK_CASES = ["fork:llamafactory-unsloth:lora", "fork:llamafactory-torch:lora", "fork:llamafactory-unsloth:full"]
AXOLOTL_CASES = ["fork:axolotl-offload:lora", "fork:axolotl-offload:full"]
CASES = ["lora", "full", "lora+unused", "lora+no_sync", "lora+static_graph", "whisper-lora", "trainer-lora",
         *FORK_CASES, "unsloth:lora", "unsloth:lora+no_sync", *AXOLOTL_CASES]
#: the cases upstream fails with DDP's error (static_graph does not search; whisper-lora fails earlier)
FAILING_UPSTREAM = ["lora", "full", "lora+unused", "lora+no_sync", "trainer-lora", "unsloth:lora",
                    "unsloth:lora+no_sync", *FORK_CASES, *AXOLOTL_CASES]
LAUNCH_TIMEOUT_S = 300


def torchrun(folder, cases, *, disabled=False, pythonpath=()):
    """2 ranks of tools/hotfix_lab/cases/ddp_cases.py; returns ({rank: result}, stderr)."""
    results, proc = launch_ranks(folder, "hotfix_lab.cases.ddp_cases", cases, disabled=disabled, pythonpath=pythonpath,
                                 timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return results, proc.stderr


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp")
    zoo = [matrix_path("unsloth-zoo", ZOO)] + [matrix_path(fork, version) for fork, version in FORKS.items()]
    with ThreadPoolExecutor(2) as pool:
        upstream = pool.submit(torchrun, folder / "upstream", CASES, disabled=True, pythonpath=zoo)
        fixed = pool.submit(torchrun, folder / "hotfix", CASES, pythonpath=zoo)
        return {"upstream": upstream.result(), "hotfix": fixed.result()}


def test_upstream_every_reentrant_case_fails_in_every_rank(launches):
    """Without hotfix: torch's and unsloth's reentrant checkpoint, LoRA and full fine-tuning, with an unused
    parameter, with no_sync, and the Trainer (find_unused_parameters=True chosen by itself) all fail in both
    ranks with DDP's error; static_graph=True (no search for unused parameters) trains equal upstream."""
    results, _ = launches["upstream"]
    for rank, result in results.items():
        assert result["hotfix_loaded"] is False and result["transformers"] == "4.56.2"
        cases = result["cases"]
        for name in FAILING_UPSTREAM:
            assert not cases[name]["ok"] and FIND_UNUSED in cases[name]["error"], (rank, name, cases[name])
        assert cases["lora+static_graph"]["ok"] and cases["lora+static_graph"]["equal"], cases["lora+static_graph"]
        assert not cases["whisper-lora"]["ok"], cases["whisper-lora"]


def test_with_hotfix_every_gradient_equals_ddp_without_checkpointing(launches):
    """With hotfix (the start-up hook, the script unchanged) every case trains in both ranks and every
    trainable parameter's gradient equals DDP's without checkpointing; parameters the forward never uses
    have no gradient in both."""
    results, stderr = launches["hotfix"]
    for rank, result in results.items():
        assert result["hotfix_loaded"] is True and result["checkpoint_function"] == "UnslothCheckpointFunction"
        cases = result["cases"]
        for name in CASES:
            case = cases[name]
            assert case["ok"] and case["equal"], (rank, name, case)
        for name in ("lora", "lora+unused", "unsloth:lora"):
            assert cases[name]["missing"] == 0 and cases[name]["trainable"] >= 8, (name, cases[name])
        unused = cases["lora+unused"]["without_gradient"]
        assert any(n.endswith("layers.0.never_used") for n in unused) and any("never_used_head" in n for n in unused)
        assert cases["lora"]["without_gradient"] == [] and cases["full"]["without_gradient"] == []
        trainer = cases["trainer-lora"]
        assert trainer["wrapper"] == "DistributedDataParallel" and trainer["find_unused_parameters"] is True
        assert trainer["steps"] == 3 and trainer["losses"] == trainer["reference_losses"], trainer
    notices = repair_notices(stderr)
    assert any("transformers-ddp-find-unused" in line for line in notices), notices


@pytest.mark.skipif(not (MATRIX / "trl-0.23.0" / ".complete").exists(),
                    reason="TRL 0.23.0 (with datasets) is not installed in .matrix/trl-0.23.0")
def test_trl_sft_trainer_lora(tmp_path):
    """TRL 0.23.0's SFTTrainer, LoRA through peft_config, its default gradient checkpointing (reentrant on
    4.56): upstream both ranks fail with DDP's error; with hotfix 3 steps with the losses and LoRA weights of
    the same trainer without checkpointing."""
    trl = [matrix_path("trl", "0.23.0")]
    upstream, _ = torchrun(tmp_path / "upstream", ["sft-lora"], disabled=True, pythonpath=trl)
    fixed, _ = torchrun(tmp_path / "hotfix", ["sft-lora"], pythonpath=trl)
    for rank in (0, 1):
        case = upstream[rank]["cases"]["sft-lora"]
        assert not case["ok"] and FIND_UNUSED in case["error"], case
        case = fixed[rank]["cases"]["sft-lora"]
        assert case["ok"] and case["equal"] and case["find_unused_parameters"] is True, case
        assert case["losses"] == case["reference_losses"], case
