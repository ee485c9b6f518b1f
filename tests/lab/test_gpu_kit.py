"""CPU self-test of the GPU kit (scripts/gpu/, tools/hotfix_lab/gpu/, docs/gpu.md), so it cannot rot between lent GPUs.

* the real ``scripts/gpu/build-carry`` into a temporary folder (it needs only PyPI), each part's
  carry list within 64 MiB with the working tree, and ``scripts/gpu/run --dry-run`` on what it
  built: every step of every part (installs from the carry, environment with the hotfix file
  imported from outside the checkout, the GPU tests' collection, the sanitizer's releases, the
  benchmark's and the fit search's plans, the soak, compile, DDP, DeepSpeed (0.19.8 and 0.19.2, each
  installed into its own folder) and non-reentrant commands, the
  seed's FastModel flow installed and its GPU test run, skipping without CUDA, the report) with
  only what needs CUDA stubbed;
* ``scripts/gpu/run --plan``: one device call per part with its carry list;
* the report on the kit's raw files of the 2026-11-25 H100 run: the batch-1 sanitizer run (no offload
  line) reads as proving nothing, the recorded ratios come back;
* the report's verdicts on the 1-GPU DDP case and the non-reentrant-default case (rows of the CPU
  runs' shape): as expected, and not as expected when hotfix loses a case, a routed call bypasses
  unsloth's function or upstream does not fail; a Trainer outside DDP is a note, not a pass; and on the
  DeepSpeed ZeRO-3 cases, 0.19.8's and 0.19.2's (before DeepSpeed's own fix: upstream's frozen-parameter
  error, hotfix's "repaired" line, the release each run reports);
* the carry size check: working tree + carried folders against 64 MiB;
* ``scripts/gpu/run --cpu-selftest --part tests``: the GPU tests themselves on the CPU seam under
  the deterministic setup: upstream crashes, hotfix's gradients equal at 1e-6 (noise floor 0) and
  bf16 within its bound; and the mutation: with one gradient dropped
  (HOTFIX_GPU_MUTATION=drop-grad) the equality test fails, naming the missing gradient;
* ``scripts/gpu/run --cpu-selftest --part bench``: the benchmark's orchestration, one variant per
  code path (the step-1 anchor pair, hotfix and upstream 2025.11.5; upstream 2025.11.3's lost adapters)
  each in its own interpreter on a tiny Whisper, then results.json and report.md; and each
  variant's transformers (5.23 for transformers' own offload) first on its path.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO, checkout_build, clean_env, matrix_path
from hotfix_lab.gpu import bench
from hotfix_lab.gpu import carry_size
from hotfix_lab.gpu import parts
from hotfix_lab.gpu import report

RUN_2026_11_25 = REPO / "docs" / "gpu-runs" / "2026-11-25-kit-38e8258"  # the kit's raw files from an H100
RUN_2026_11_29 = REPO / "docs" / "gpu-runs" / "2026-11-29-h200"  # the rebuilt kit's tests, extras, bench on an H200

RUN = ["bash", str(REPO / "scripts" / "gpu" / "run")]


def _git_tree(root, files):
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for name, size in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.truncate(size)  # sparse: the size check reads sizes, not contents
    (root / ".gitignore").write_text("/.whl/\n")


def test_carry_size_counts_tree_and_carry_against_the_limit(tmp_path):
    _git_tree(tmp_path, {"src/a.py": 3 << 20, "untracked.txt": 1 << 20, ".whl/base/big.whl": 30 << 20,
                         ".whl/t5/t.whl": 10 << 20, ".whl/ds/d.whl": 1 << 20, ".whl/ds192/d.whl": 1 << 20})
    folders = [str(tmp_path / ".whl" / "base"), str(tmp_path / ".whl" / "t5")]
    tree, carried, ok = carry_size.check(str(tmp_path), folders)
    assert tree == (4 << 20) + len("/.whl/\n") and carried == 40 << 20 and ok
    assert carry_size.check(str(tmp_path), folders[0])[1] == 30 << 20  # a part carrying a subset
    with open(tmp_path / ".whl" / "t5" / "more.whl", "wb") as handle:
        handle.truncate(21 << 20)
    assert carry_size.check(str(tmp_path), folders)[2] is False  # 65 MiB > 64
    assert carry_size.main([*folders, "--root", str(tmp_path)]) == 1
    assert [name for name, *_ in parts.check_carry(str(tmp_path / ".whl"), str(tmp_path))] == ["tests", "bench", "extras", "fit"]


def test_report_on_the_h100_run_of_2026_11_25():
    # the sanitizer ran at batch 1: no offload line, so its 0 races must not read as a result
    sanitizer = report.sanitizer_summary(str(RUN_2026_11_25 / "sanitizer.txt"))
    assert set(sanitizer) == {"2025.11.3", "2026.8.9"}
    assert all(f["races"] == 0 and "proves nothing" in f["verdict"] for f in sanitizer.values()), sanitizer
    # the recorded ratios come back from the raw rows; the fixed-bound gradients column of that kit is flagged
    rows = json.loads((RUN_2026_11_25 / "bench.json").read_text())["rows"]
    found = report.targets(rows)
    memory, time = (found[f"{k}_hotfix+zoo-2025.11.3_over_non-reentrant"] for k in ("steady_peak", "step_time"))
    assert (memory["batch"], round(memory["ratio"], 3), round(time["ratio"], 3)) == (64, 0.595, 1.039), found
    assert "gradients not equal" in memory["note"]
    assert not [name for name in found if name.startswith("step1_peak")]  # 2025.11.5 was skipped: no anchor


def test_report_on_the_h200_run_of_2026_11_29():
    """The raw files of the rebuilt kit's first GPU run give back the verdicts and ratios docs/gpu.md records."""
    tests = report.tests_summary(str(RUN_2026_11_29 / "tests" / "gpu-tests.xml"))
    assert (tests["passed"], tests["failed"], tests["skipped"]) == (12, 0, 0), tests
    sanitizer = report.sanitizer_summary(str(RUN_2026_11_29 / "tests" / "sanitizer.txt"))
    assert {release: found["verdict"] for release, found in sanitizer.items()} == {
        release: "0 races with the offload active from step 1" for release in ("2025.11.3", "2026.8.9")}, sanitizer
    found = report.targets(json.loads((RUN_2026_11_29 / "bench" / "bench.json").read_text())["rows"])
    ratio = {name: round(entry["ratio"], 3) for name, entry in found.items()}
    assert ratio["step1_peak_anchor:hotfix+zoo-2025.11.3_over_anchor:zoo-2025.11.5_b1"] == 1.0, ratio
    assert ratio["step1_peak_anchor:hotfix+zoo-2025.11.3_over_anchor:zoo-2025.11.5_b64"] == 0.995, ratio
    assert (ratio["steady_peak_hotfix+zoo-2025.11.3_over_non-reentrant"],
            ratio["step_time_hotfix+zoo-2025.11.3_over_non-reentrant"]) == (0.595, 1.045), ratio
    assert report.nonreentrant_summary(str(RUN_2026_11_29 / "extras" / "nonreentrant.jsonl"))["problems"] == []
    # the pinned-refused case: the corrected re-run passes; the first run's row (no deterministic settings, judged
    # at 1e-6) is what the kit's correction was for
    assert report.pinned_summary(str(RUN_2026_11_29 / "pinned"))["problems"] == []
    first = json.loads((RUN_2026_11_29 / "extras" / "results.json").read_text())["pinned"]
    assert first["hotfix"]["deterministic"] is False and first["hotfix"]["grads_equal"] == [False, False]


def _ddp_run(tmp, run, loaded, cases):
    folder = tmp / "ddp" / run
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rank0.json").write_text(json.dumps({"rank": 0, "world": 1, "hotfix_loaded": loaded, "device": "cuda:0",
                                                   "torch": "2.11.0", "transformers": "4.56.2", "cases": cases}))


def test_report_judges_the_deepspeed_cases(tmp_path):
    equal = {"ok": True, "equal": True, "params_equal": True, "summary": "88/88 parameter gradients equal"}
    upstream = {name: equal if failure is None else {"ok": False, "error": f"RuntimeError: {failure}"}
                for name, failure in report.DEEPSPEED_UPSTREAM.items()}
    fixed = {name: dict(equal) for name in upstream}
    for run, loaded, cases in (("upstream", False, upstream), ("hotfix", True, fixed)):
        folder = tmp_path / "deepspeed" / run
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "rank0.json").write_text(json.dumps({"rank": 0, "world": 1, "hotfix_loaded": loaded, "cases": cases,
                                                       "device": "cuda", "deepspeed": "0.19.8"}))
    assert report.deepspeed_summary(str(tmp_path))["problems"] == []
    fixed["zero3:whisper:reentrant"] = dict(equal, params_equal=False)
    (tmp_path / "deepspeed" / "hotfix" / "rank0.json").write_text(json.dumps(
        {"rank": 0, "world": 1, "hotfix_loaded": True, "cases": fixed, "deepspeed": "0.19.8"}))
    problems = report.deepspeed_summary(str(tmp_path))["problems"]
    assert len(problems) == 1 and problems[0].startswith("hotfix zero3:whisper:reentrant"), problems
    assert report.deepspeed_summary(str(tmp_path / "none")) is None
    assert report.deepspeed_before_fix_summary(str(tmp_path)) is None  # the 0.19.2 launches did not run


SAID = "hotfix: repaired a non-reentrant checkpoint ... (deepspeed-zero3-frozen-recompute, ...)"


def _deepspeed_before_fix_runs(tmp, upstream, fixed, release=report.DEEPSPEED_BEFORE_FIX, said=SAID):
    for run, loaded, cases, log in (("upstream", False, upstream, "no repair\n"), ("hotfix", True, fixed, said + "\n")):
        folder = tmp / f"deepspeed-{report.DEEPSPEED_BEFORE_FIX}" / run
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "rank0.json").write_text(json.dumps({"rank": 0, "world": 1, "hotfix_loaded": loaded, "cases": cases,
                                                       "device": "cuda", "deepspeed": release}))
        (folder / "log.txt").write_text(log)


def test_report_judges_the_deepspeed_cases_before_its_own_fix(tmp_path):
    # DeepSpeed 0.19.2: upstream the frozen-parameter error in the non-reentrant LoRA cases, reentrant equal; with
    # hotfix every case equal and deepspeed-zero3-frozen-recompute's repaired line in the hotfix run's log
    equal = {"ok": True, "equal": True, "params_equal": True, "summary": "8/8 parameter gradients equal"}
    upstream = {name: equal if failure is None else {"ok": False, "error": f"CheckpointError: ... {failure} ..."}
                for name, failure in report.DEEPSPEED_BEFORE_FIX_UPSTREAM.items()}
    assert [name for name, failure in report.DEEPSPEED_BEFORE_FIX_UPSTREAM.items() if failure] == [
        "zero3:lora:nonreentrant", "zero3:whisper-lora:nonreentrant"]
    fixed = {name: dict(equal) for name in upstream}
    _deepspeed_before_fix_runs(tmp_path, upstream, fixed)
    found = report.deepspeed_before_fix_summary(str(tmp_path))
    assert found["problems"] == [] and found["release"] == "0.19.2" and len(found["rows"]) == 3, found
    text = report.markdown({}, {"ran": False}, {}, {}, deepspeed_before_fix=found)
    assert "## DeepSpeed 0.19.2 ZeRO-3" in text and "fails: " + report.FROZEN_PARAMETER_ERROR in text, text
    # upstream trains where it should fail, hotfix loses a case, no repaired line, the wrong release: each a problem
    lost = {"zero3:whisper-lora:nonreentrant": upstream["zero3:whisper-lora:nonreentrant"]}
    _deepspeed_before_fix_runs(tmp_path, dict(upstream, **{"zero3:lora:nonreentrant": equal}), dict(fixed, **lost),
                               said="nothing")
    problems = report.deepspeed_before_fix_summary(str(tmp_path))["problems"]
    assert [p.split(":")[0] for p in problems] == ["upstream zero3", "hotfix zero3", "hotfix"], problems
    assert "deepspeed-zero3-frozen-recompute" in problems[2], problems
    _deepspeed_before_fix_runs(tmp_path, upstream, fixed, release="0.19.8")
    problems = report.deepspeed_before_fix_summary(str(tmp_path))["problems"]
    assert len(problems) == 2 and all("expected 0.19.2" in p for p in problems), problems


def test_report_judges_the_ddp_and_non_reentrant_cases(tmp_path):
    mark = {"ok": False, "error": "RuntimeError: " + report.DDP_ERROR}
    equal = {"ok": True, "equal": True, "summary": "8/8 parameter gradients equal"}
    upstream = {name: mark for name in ("lora", "full", "lora+unused", "lora+no_sync")}
    upstream.update({"lora+static_graph": equal, "whisper-lora": {"ok": False, "error": "RuntimeError: element 0 ..."},
                     "trainer-lora": dict(equal, wrapper="PeftModel")})  # one CUDA process: accelerate adds no DDP
    fixed = {name: dict(equal) for name in upstream}
    _ddp_run(tmp_path, "upstream", False, upstream)
    _ddp_run(tmp_path, "hotfix", True, fixed)
    found = report.ddp_summary(str(tmp_path))
    assert found["problems"] == [] and any("outside DDP" in note for note in found["notes"]), found
    fixed["lora+no_sync"] = {"ok": False, "error": "RuntimeError: " + report.DDP_ERROR}
    upstream["full"] = equal
    _ddp_run(tmp_path, "upstream", False, upstream)
    _ddp_run(tmp_path, "hotfix", True, fixed)
    problems = report.ddp_summary(str(tmp_path))["problems"]
    assert len(problems) == 2 and problems[0].startswith("upstream full") and problems[1].startswith("hotfix lora+no_sync")

    from hotfix_lab.gpu import nonreentrant

    def row(release, variant, nodes, line, said=False, **extra):
        steps = [{"unsloth_nodes_per_layer": nodes, "offload_line": line and n == 0, "peak": 100 + 10 * nodes,
                  "grads_equal": True, "max_rel_error": 0.0, "missing": 0} for n in range(3)]
        return dict(release=release, variant=variant, status="ok", steps=steps, offload_line_step1=line, bound=1e-6,
                    steady_peak=100 + 10 * nodes, offload_fp32=None,
                    hotfix_lines=["hotfix: repaired ... unsloth-zoo-nonreentrant-offload ..."] if said else [], **extra)

    rows = [row("2025.11.5", "upstream:default", 0.0, False), row("2025.11.5", "upstream:trl", 0.0, False),
            row("2025.11.5", "hotfix:default", 1.0, True, said=True), row("2025.11.5", "hotfix:trl", 1.0, True, said=True),
            row("2025.11.5", "upstream:reentrant", 1.0, True)]
    rows += [row("2026.10.9", variant, 1.0, True) for variant, _, _ in nonreentrant.VARIANTS]
    assert nonreentrant.verdict(rows) == []
    assert nonreentrant.peak_ratios(rows)["2025.11.5 hotfix:default / upstream:default"] == 110 / 100
    bypassed = [dict(r, steps=[dict(s, unsloth_nodes_per_layer=0.0) for s in r["steps"]], offload_line_step1=False)
                if r["variant"] == "hotfix:trl" and r["release"] == "2025.11.5" else r for r in rows]
    assert [p.split(":")[0] + ":" + p.split(":")[1] for p in nonreentrant.verdict(bypassed)] == ["2025.11.5 hotfix:trl"] * 2
    fixed_upstream = [dict(r, hotfix_lines=["hotfix: repaired ... unsloth-zoo-nonreentrant-offload"])
                      if r["variant"] == "hotfix:default" and r["release"] == "2026.10.9" else r for r in rows]
    assert "line printed" in nonreentrant.verdict(fixed_upstream)[0]  # a repair where nothing was broken: untrue
    dropped = [dict(r, steps=[dict(s, grads_equal=False, missing=1) for s in r["steps"]])
               if r["variant"] == "upstream:reentrant" else r for r in rows]
    assert len(nonreentrant.verdict(dropped)) == 6  # 3 steps x 2 releases


def test_report_judges_the_moe_cases(tmp_path):
    """hotfix_lab.cases.moe_cases's rows in bf16 (scripts/gpu/run's extras): hotfix not equal is a problem; the drift
    device flipping nothing upstream is one too (the case proved nothing); without drift upstream may be equal."""
    folder = tmp_path / "moe"
    folder.mkdir()

    def write(name, rows):
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))

    def row(case, status, version):
        return {"case": case, "status": status, "transformers": version, "summary": f"{status} summary"}

    cases = ("qwen3_moe:non-reentrant", "qwen3_moe:non-reentrant:nodrift")
    write("4-upstream.jsonl", [row(cases[0], "crash", "4.56.2"), row(cases[1], "equal", "4.56.2")])
    write("4-hotfix.jsonl", [row(case, "equal", "4.56.2") for case in cases])
    write("5-upstream.jsonl", [row(cases[0], "differs", "5.23.0"), row(cases[1], "equal", "5.23.0")])
    write("5-hotfix.jsonl", [row(case, "equal", "5.23.0") for case in cases])
    found = report.moe_summary(str(tmp_path))
    assert found["problems"] == [] and len(found["rows"]) == 4, found
    assert "## MoE routing replay" in "\n".join(report._moe_markdown(found))
    write("5-hotfix.jsonl", [row(cases[0], "differs", "5.23.0"), row(cases[1], "equal", "5.23.0")])
    write("4-upstream.jsonl", [row(case, "equal", "4.56.2") for case in cases])
    problems = report.moe_summary(str(tmp_path))["problems"]
    assert problems == ["transformers 4.56.2 qwen3_moe:non-reentrant: the drift device flipped no token upstream",
                        "transformers 5.23.0 qwen3_moe:non-reentrant: with hotfix differs"], problems
    assert report.moe_summary(str(tmp_path / "none")) is None
    # unsloth-zoo's fused router (zoo_moe.py): the kernel must have chosen in upstream's recomputations and in none
    # of hotfix's; its last line (the callers) is no case
    write("4-upstream.jsonl", [row(cases[0], "crash", "4.56.2"), row(cases[1], "equal", "4.56.2")])
    write("5-hotfix.jsonl", [row(case, "equal", "5.23.0") for case in cases])
    fused = "qwen3_moe:reentrant"
    write("zoo-upstream.jsonl", [dict(row(fused, "differs", "5.23.0"), kernel_recomputations=2),
                                 {"case": "callers", "callers_eager_inside": []}])
    write("zoo-hotfix.jsonl", [dict(row(fused, "equal", "5.23.0"), kernel_recomputations=0),
                               {"case": "callers", "callers_eager_inside": ["qwen3_moe"]}])
    found = report.moe_summary(str(tmp_path))
    assert found["problems"] == [] and len(found["rows"]) == 5, found
    write("zoo-hotfix.jsonl", [dict(row(fused, "equal", "5.23.0"), kernel_recomputations=2)])
    assert report.moe_summary(str(tmp_path))["problems"] == [
        "transformers 5.23.0 qwen3_moe:reentrant (unsloth-zoo's fused router): with hotfix the kernel chose in 2 "
        "recomputation(s)"]


def test_pinned_summary_wants_upstream_refused_and_hotfix_equal(tmp_path):
    folder = tmp_path / "pinned"
    folder.mkdir()

    def write(side, row):
        (folder / f"{side}.jsonl").write_text(json.dumps(row) + "\n")

    write("upstream", {"status": "crash", "error": "set-up: RuntimeError: CUDA error: out of memory"})
    write("hotfix", {"status": "ok", "grads_equal": [True, True], "max_rel_error": 1e-7, "offload_message_step1": True})
    found = report.pinned_summary(str(tmp_path))
    assert found["problems"] == [], found
    # equal without the offload line: the pageable buffers were never used, so it proves nothing
    write("hotfix", {"status": "ok", "grads_equal": [True, True], "max_rel_error": 1e-7, "offload_message_step1": False})
    assert report.pinned_summary(str(tmp_path))["problems"] == [
        "with hotfix: no offload line in step 1: the pageable buffers were never used"]
    assert "pinned host memory refused" in "\n".join(report._pinned_markdown(found))
    write("hotfix", {"status": "ok", "grads_equal": [True, False], "max_rel_error": 0.1})
    write("upstream", {"status": "ok", "grads_equal": [True, True]})
    assert len(report.pinned_summary(str(tmp_path))["problems"]) == 2
    assert report.pinned_summary(str(tmp_path / "none")) is None


def test_only_names_groups_of_extras_and_refuses_what_it_does_not_know():
    """``--only`` re-runs groups of extras; a typo or another part is refused before anything is installed
    (a group that runs nothing would report its absent rows as nothing wrong)."""
    env = clean_env({"PYTHON": sys.executable})
    for args, said in ((["--part", "extras", "--only", "moe,pinnned"], "unknown group 'pinnned'"),
                       (["--part", "tests", "--only", "moe"], "--only selects groups of --part extras")):
        proc = subprocess.run([*RUN, *args], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr, (args, proc.returncode, proc.stderr)


def test_plan_is_one_device_call_per_part_with_its_carry():
    proc = subprocess.run([*RUN, "--plan"], env=clean_env({"PYTHON": sys.executable}), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    for part in parts.PARTS:
        call = f'run(command="bash scripts/gpu/run --part {part.name}", carry={parts.carry_list(part.name)!r}'
        assert call in proc.stdout, (call, proc.stdout)
        assert part.estimate_s < 8 * 60, part  # each call well inside the device's 10 minutes
    bare = subprocess.run(RUN, env=clean_env({"PYTHON": sys.executable}), capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "--part tests" in bare.stderr  # no part named: the plan, not a 10-minute call


def _matrix_zoo_releases():
    return [line.split()[1] for line in (REPO / "tests" / "matrix.txt").read_text().splitlines()
            if line.split()[:1] == ["unsloth-zoo"]]


def test_build_carry_then_dry_run_takes_every_step_of_every_part(tmp_path):
    carry = tmp_path / "carry"
    env = clean_env({"PYTHON": sys.executable})
    with checkout_build():  # it builds hotfix's wheel in the checkout
        built = subprocess.run(["bash", str(REPO / "scripts" / "gpu" / "build-carry"), str(carry)], env=env,
                               cwd=str(REPO), capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    names = sorted(f"{path.parent.name}/{path.name}" for path in carry.glob("*/*.whl"))
    for prefix in ["base/hotfix_checkpoint-", "base/transformers-4.56.2-", "base/tokenizers-", "base/huggingface_hub-",
                   "t5/transformers-5.23.0-", "ds/deepspeed-0.19.8-", "ds/pydantic-", "ds192/deepspeed-0.19.2-"] + [
                   f"base/unsloth_zoo-{version}-" for version in _matrix_zoo_releases()]:
        assert any(name.startswith(prefix) for name in names), (prefix, names)
    for name, tree, carried, fits in parts.check_carry(str(carry), str(REPO)):
        assert fits and f"part {name}: " in built.stdout, (name, tree, carried)

    out, site = tmp_path / "out", tmp_path / "site"
    env.update(OUT=str(out), HOTFIX_GPU_CARRY=str(carry), HOTFIX_GPU_SITE=str(site), OMP_NUM_THREADS="1")
    proc = subprocess.run([*RUN, "--dry-run"], env=env, cwd=str(REPO), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # every install the GPU run makes, from the carry, into private folders
    assert (site / "hotfix" / "hotfix" / "patches").is_dir()
    for folder in ["transformers-4.56.2", "transformers-5.23.0"]:
        assert (site / folder / "transformers" / "__init__.py").is_file(), folder
    for version in _matrix_zoo_releases():
        assert (site / f"unsloth-zoo-{version}" / "unsloth_zoo" / "gradient_checkpointing.py").is_file(), version
    # run from outside the checkout: the installed hotfix, with its fixes, is the one imported
    environment = json.loads((out / "environment.json").read_text())
    assert environment["hotfix_file"].startswith(str(site)) and environment["hotfix_fixes"], environment
    # the GPU tests import and collect; every benchmark variant and fit search finds what it needs
    collected = (out / "gpu-tests-collected.txt").read_text()
    assert "tests collected" in collected and "error" not in collected.lower(), collected
    results = json.loads((out / "results.json").read_text())
    statuses = {row["variant"]: row["status"] for row in results["bench"]["rows"]}
    assert len(statuses) == 9 and set(statuses.values()) == {"planned"}, statuses
    assert {row["status"] for row in results["fit"]["rows"]} == {"planned"}, results["fit"]
    assert "soak (hotfix):" in proc.stdout and "compile_case --model whisper --function unsloth" in proc.stdout
    assert "hotfix_lab.cases.ddp_cases" in proc.stdout and "lora+no_sync" in proc.stdout
    assert "hotfix_lab.cases.deepspeed_cases" in proc.stdout and "trainer-zero3:whisper:reentrant" in proc.stdout
    assert (site / "deepspeed" / "deepspeed" / "__init__.py").is_file()
    # DeepSpeed 0.19.2 (before its own fix) in its own folder, with what it needs, launched upstream and with hotfix
    assert (site / "deepspeed-0.19.2" / "deepspeed-0.19.2.dist-info").is_dir()
    assert (site / "deepspeed-0.19.2" / "pydantic").is_dir()
    assert not (site / "deepspeed" / "deepspeed-0.19.2.dist-info").exists()
    for run in ("upstream", "hotfix"):
        cases = "zero3:lora:nonreentrant zero3:whisper-lora:nonreentrant zero3:lora:reentrant"
        assert f"deepspeed 0.19.2 ({run}): PYTHONPATH=" in proc.stdout, proc.stdout
        assert f"deepspeed-0.19.2/{run} {cases}" in proc.stdout, proc.stdout
    for child in ("nonreentrant 2025.11.5 hotfix:default", "nonreentrant 2026.10.9 upstream:reentrant"):
        assert child in proc.stdout, child
    # the seed's flow: unsloth installed from the carry, its GPU test run from outside the checkout (no CUDA: skipped)
    assert (site / "unsloth" / "unsloth" / "__init__.py").is_file() and (site / "unsloth" / "unsloth_zoo").is_dir()
    unsloth = results["unsloth"]["tests"]
    assert [(c["name"], c["outcome"]) for c in unsloth["cases"]] == [("test_seed_flow_with_hotfix", "skipped")], unsloth
    assert "needs CUDA" in unsloth["cases"][0]["message"], unsloth
    report_text = (out / "report.md").read_text()
    assert "## Benchmark" in report_text and "## The seed's FastModel flow" in report_text


def _cases(out):
    return {(c["release"], c["dtype"], c["hotfix"]): c["row"] for c in
            map(json.loads, (out / "gpu-test-cases.jsonl").read_text().splitlines())}


def test_gpu_tests_on_the_cpu_path_compare_at_1e6_and_fail_on_a_dropped_gradient(tmp_path):
    matrix_path("unsloth-zoo", "2025.11.3")
    env = clean_env({"OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
                     "HOTFIX_GPU_SITE": str(tmp_path / "site"), "HOTFIX_GPU_RELEASES": "2025.11.3", "HOTFIX_GPU_JOBS": "2"})
    # the mutation, alongside (its own pytest of the same module): one gradient dropped after every
    # checkpointed step must make the equality test fail
    mutated = dict(env, HOTFIX_GPU_DEVICE="cpu", HOTFIX_GPU_SITE=str(REPO / ".matrix"), HOTFIX_GPU_MUTATION="drop-grad",
                   HOTFIX_GPU_OUT=str(tmp_path))
    mutation = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-c",
                                 str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
                                 str(REPO / "tests" / "versions" / "test_gpu_unsloth_zoo.py"), "-k", "hotfix_gradients_equal"],
                                env=mutated, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc = subprocess.run([*RUN, "--cpu-selftest", "--part", "tests"], env=env, cwd=str(REPO), capture_output=True,
                          text=True, timeout=600)
    mutated_out = mutation.communicate(timeout=600)[0]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tests = json.loads((tmp_path / "out" / "results.json").read_text())["tests"]
    outcomes = {case["name"]: case["outcome"] for case in tests["cases"]}
    assert outcomes == {"test_upstream_crashes[2025.11.3]": "passed",
                        "test_hotfix_gradients_equal_and_offload_from_step_1[2025.11.3]": "passed",
                        "test_bf16_gradients_equal_with_hotfix[2025.11.3]": "passed",
                        "test_accelerate_fsdp_trainer_on_cuda": "skipped",
                        "test_new_api_with_offload_on_cuda": "skipped"}, outcomes
    fixed = _cases(tmp_path / "out")[("2025.11.3", "float32", True)]
    assert fixed["deterministic"] and fixed["noise_floor"] == 0.0 and fixed["bound"] == 1e-6, fixed
    assert fixed["max_rel_error"] <= 1e-6 and fixed["missing_grads"] == 0, fixed
    assert mutation.returncode == 1 and "1 failed" in mutated_out, mutated_out[-3000:]
    dropped = _cases(tmp_path)[("2025.11.3", "float32", True)]
    assert dropped["mutation"] == "drop-grad" and dropped["missing_grads"] == 1, dropped
    assert dropped["grads_equal"] == [False, False, False] and dropped["max_rel_error"] <= 1e-6, dropped


def test_each_variant_runs_on_its_transformers():
    args = type("Args", (), {"transformers": "/t4", "transformers5": "/t5"})()
    names = {name: which for name, _mode, _zoo, _env, which, _extra in bench.VARIANTS}
    assert names["hf-offload"] == "5" and {w for n, w in names.items() if n != "hf-offload"} == {"4"}
    assert bench.variant_env({}, "5", args)["PYTHONPATH"].split(":")[0] == "/t5"
    assert bench.variant_env({}, "4", args)["PYTHONPATH"].split(":")[0] == "/t4"


def test_bench_orchestration_on_cpu(tmp_path):
    # one variant per code path CI can run: the step-1 anchor pair (hotfix and upstream 2025.11.5 on the anchor
    # shape), upstream's lost adapters (the other six are the same paths with other releases or shapes; the
    # dry run checks what they need)
    only = "anchor:hotfix+zoo-2025.11.3,anchor:zoo-2025.11.5,zoo-2025.11.3"
    matrix_path("unsloth-zoo", "2025.11.3")  # the self-test uses the matrix's releases
    env = clean_env({"OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
                     "HOTFIX_GPU_SITE": str(tmp_path / "site"), "HOTFIX_GPU_BENCH_ONLY": only})
    proc = subprocess.run([*RUN, "--cpu-selftest", "--part", "bench"], env=env, cwd=str(REPO), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["variant"], r.get("batch")): r for r in results["bench"]["rows"]}
    assert {variant for variant, _ in rows} == set(only.split(",")), rows
    for variant in ("anchor:hotfix+zoo-2025.11.3", "anchor:zoo-2025.11.5"):
        for batch in (1, 2):
            assert rows[(variant, batch)]["status"] == "ok", rows[(variant, batch)]
        # correctness at the first batch size, by the kit's rule (noise floor and workaround measured)
        first = rows[(variant, 1)]
        assert first["grads_equal"] == [True, True] and first["bound"] == 1e-6, first
        assert first["noise_floor"] == 0.0 and first["workaround_error"] == 0.0, first
    # LoRA on q/v with unsloth's checkpoint upstream loses the encoder adapters' gradients (or crashes);
    # on the anchor shape (decoder adapters only) upstream 2025.11.5 is right, so it can anchor the step-1 peak
    upstream = rows[("zoo-2025.11.3", 1)]
    assert upstream["status"] == "crash" or upstream["missing_grads"] > 0, upstream
    assert rows[("anchor:zoo-2025.11.5", 1)]["hotfix"] is False and rows[("anchor:zoo-2025.11.5", 1)]["labels"] == 448
    report = (tmp_path / "report.md").read_text()
    assert "## Benchmark" in report and "## Targets (reported, not asserted)" in report
    assert results["environment"]["device"] == "no CUDA device"
    memory = [t for name, t in results["targets"].items() if "peak" in name]
    assert memory and all(t["ratio"] is None for t in memory), results["targets"]  # CPU: no memory ratio claimed
    assert "step1_peak_anchor:hotfix+zoo-2025.11.3_over_anchor:zoo-2025.11.5_b1" in results["targets"]
