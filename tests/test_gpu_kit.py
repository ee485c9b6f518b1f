"""CPU self-test of the GPU kit (scripts/gpu/, docs/gpu.md), so it cannot rot while no GPU is lent.

* the carry builder's size check: working tree + carried folder against 64 MiB;
* the runner's whole orchestration (``scripts/gpu/run --cpu-selftest``): every
  benchmark variant in its own interpreter on a tiny Whisper, on this CPU, the
  unsloth-zoo releases of .matrix/ through tools/zoo_loader.py's CPU seam, then
  results.json and report.md.  The seed's crash must show upstream and hotfix
  must train, exactly as the GPU run expects.
"""

from __future__ import annotations

import json
import subprocess
import sys


from conftest import REPO, clean_env, matrix_path

sys.path.insert(0, str(REPO / "scripts" / "gpu"))
import carry_size  # noqa: E402


def _git_tree(root, files):
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for name, size in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.truncate(size)  # sparse: the size check reads sizes, not contents
    (root / ".gitignore").write_text("/.whl/\n")


def test_carry_size_counts_tree_and_carry_against_the_limit(tmp_path):
    _git_tree(tmp_path, {"src/a.py": 3 << 20, "untracked.txt": 1 << 20, ".whl/big.whl": 40 << 20})
    tree, carried, ok = carry_size.check(str(tmp_path), str(tmp_path / ".whl"))
    assert tree == (4 << 20) + len("/.whl/\n") and carried == 40 << 20 and ok
    with open(tmp_path / ".whl" / "more.whl", "wb") as handle:
        handle.truncate(21 << 20)
    assert carry_size.check(str(tmp_path), str(tmp_path / ".whl"))[2] is False  # 65 MiB > 64
    assert carry_size.main([str(tmp_path / ".whl"), "--root", str(tmp_path)]) == 1


def test_runner_orchestration_on_cpu(tmp_path):
    matrix_path("unsloth-zoo", "2025.11.3")  # the self-test uses the matrix's releases
    env = clean_env({"OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"})
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu" / "run"), "--cpu-selftest"], env=env, cwd=str(REPO),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["variant"], r.get("batch")): r for r in results["bench"]["rows"]}
    variants = {variant for variant, _ in rows}
    assert {"none", "non-reentrant", "zoo-2025.11.3", "hotfix+zoo-2025.11.3", "zoo-2025.11.5",
            "hotfix+zoo-2026.10.9", "hf-offload"} <= variants, variants
    for batch in (1, 2):
        assert rows[("none", batch)]["status"] == "ok", rows[("none", batch)]
        assert rows[("non-reentrant", batch)]["status"] == "ok"
        for fixed in ("hotfix+zoo-2025.11.3", "hotfix+zoo-2026.10.9"):
            assert rows[(fixed, batch)]["status"] == "ok", rows[(fixed, batch)]
    # correctness is measured at the first batch size: LoRA on q/v with unsloth's checkpoint
    # upstream loses the encoder adapters' gradients (or crashes); with hotfix every one is equal
    upstream = rows[("zoo-2025.11.3", 1)]
    assert upstream["status"] == "crash" or upstream["grads_equal"] == [False, False], upstream
    for fixed in ("hotfix+zoo-2025.11.3", "hotfix+zoo-2026.10.9", "non-reentrant"):
        assert rows[(fixed, 1)]["grads_equal"] == [True, True], rows[(fixed, 1)]
    report = (tmp_path / "report.md").read_text()
    assert "## Benchmark" in report and "## Targets (reported, not asserted)" in report
    assert results["environment"]["device"] == "no CUDA device"
    memory = [t for name, t in results["targets"].items() if "peak" in name]
    assert memory and all(t["ratio"] is None for t in memory), results["targets"]  # CPU: no memory ratio claimed
