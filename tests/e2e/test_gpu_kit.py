"""CPU self-test of the GPU kit (scripts/gpu/, tools/gpu/, docs/gpu.md), so it cannot rot while no GPU is lent.

* the real ``scripts/gpu/build-carry`` into a temporary folder (it needs only PyPI), and
  ``scripts/gpu/run --dry-run`` on what it built: every step of the GPU run (installs from
  the carry, environment, the GPU tests' collection, the benchmark's plan, the report) with
  only the GPU-only parts stubbed;
* the carry builder's size check: working tree + carried folder against 64 MiB;
* the runner's whole orchestration (``scripts/gpu/run --cpu-selftest``): every
  benchmark variant in its own interpreter on a tiny Whisper, on this CPU, the
  unsloth-zoo releases of .matrix/ through tools/lab/zoo_loader.py's CPU seam, then
  results.json and report.md.  The seed's crash must show upstream and hotfix
  must train, exactly as the GPU run expects.
"""

from __future__ import annotations

import json
import subprocess
import sys


from conftest import REPO, clean_env, matrix_path

sys.path.insert(0, str(REPO / "tools" / "gpu"))
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


def _matrix_zoo_releases():
    return [line.split()[1] for line in (REPO / "tests" / "matrix.txt").read_text().splitlines()
            if line.split()[:1] == ["unsloth-zoo"]]


def test_build_carry_then_dry_run_takes_every_step_of_the_gpu_run(tmp_path):
    carry = tmp_path / "carry"
    env = clean_env({"PYTHON": sys.executable})
    built = subprocess.run(["bash", str(REPO / "scripts" / "gpu" / "build-carry"), str(carry)], env=env,
                           cwd=str(REPO), capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    names = sorted(path.name for path in carry.iterdir())
    for prefix in ["hotfix_checkpoint-", "transformers-4.56.2-", "tokenizers-", "huggingface_hub-"] + [
            f"unsloth_zoo-{version}-" for version in _matrix_zoo_releases()]:
        assert any(name.startswith(prefix) and name.endswith(".whl") for name in names), (prefix, names)
    tree, carried, fits = carry_size.check(str(REPO), str(carry))
    assert fits and "fits" in built.stdout, (tree, carried)

    out, site = tmp_path / "out", tmp_path / "site"
    env.update(OUT=str(out), HOTFIX_GPU_CARRY=str(carry), HOTFIX_GPU_SITE=str(site), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu" / "run"), "--dry-run"], env=env, cwd=str(REPO),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # every install the GPU run makes, from the carry, into private folders
    assert (site / "hotfix" / "hotfix" / "__init__.py").is_file()
    assert (site / "transformers-4.56.2" / "transformers" / "__init__.py").is_file()
    for version in _matrix_zoo_releases():
        assert (site / f"unsloth-zoo-{version}" / "unsloth_zoo" / "gradient_checkpointing.py").is_file(), version
    # the GPU tests import and collect; every benchmark variant finds what it needs; the report renders
    collected = (out / "gpu-tests-collected.txt").read_text()
    assert "tests collected" in collected and "error" not in collected.lower(), collected
    results = json.loads((out / "results.json").read_text())
    statuses = {row["variant"]: row["status"] for row in results["bench"]["rows"]}
    assert statuses and set(statuses.values()) == {"planned"}, statuses
    assert "## Benchmark" in (out / "report.md").read_text()


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
