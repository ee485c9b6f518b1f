"""moe-routing-replay across transformers 4.56.2 and 5.24.0: the MoE routing census (hotfix_lab.census.moe_routing).

Every MoE model type each line's modeling code has (a causal LM calling ``topk``, a config counting experts), built
tiny, its routers tied and drifted during the recomputation only (hotfix_lab.cases.moe_cases: the last-bit drift a GPU
makes), one step with reentrant and with non-reentrant checkpointing against the same step without, in a child
without hotfix and one with it; LoRA on the router; no drift (bit-identical with and without hotfix).  The census
exits 1 where a measured cell is not equal with hotfix, a drift cell that flipped a token upstream is equal there,
or the no-drift gradients differ by a bit; this test also holds docs/census/moe-routing.md to what the run
renders (the page is what CI measured).  ~30 s on the 2-core machine.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import IN_CI, MATRIX, REPO, clean_env

CENSUS = ["-P", "-m", "hotfix_lab.census.moe_routing"]
PAGE = REPO / "docs" / "census" / "moe-routing.md"


def test_every_moe_type_routes_as_its_forward_did(tmp_path):
    if not (MATRIX / "transformers-5.24.0").is_dir() and not IN_CI:
        pytest.skip("transformers 5.24.0 is not installed in .matrix/ (scripts/test.sh installs it)")
    page = tmp_path / "moe-routing.md"
    proc = subprocess.run([sys.executable, *CENSUS, "--page", str(page)], capture_output=True, text=True,
                          timeout=900, cwd=str(tmp_path), env=clean_env())
    problems = [line for line in proc.stdout.splitlines() if line.startswith("PROBLEM")]
    assert proc.returncode == 0, "\n".join(problems) or proc.stderr[-3000:]
    assert page.read_text() == PAGE.read_text(), "docs/census/moe-routing.md differs from this run"
    text = page.read_text()
    # the table (Qwen3-MoE, Mixtral, gpt-oss, OLMoE; LoRA on the router), both lines, both modes
    for model in ("qwen3_moe", "mixtral", "gpt_oss", "olmoe"):
        for section in text.split("## transformers ")[1:]:
            row = next(line for line in section.splitlines() if line.startswith(f"| {model} |"))
            cells = [cell.strip() for cell in row.split("|")[2:6]]
            assert cells[1].startswith("equal") and cells[3].startswith("equal"), row
            assert not cells[0].startswith("equal") and not cells[2].startswith("equal"), row
