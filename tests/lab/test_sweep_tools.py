"""In-process unit tests of the sweep's own rules: the per-family tables and the coverage count.

The sweep (tools/hotfix_lab/sweep/sweep_models.py) is developer tooling, but its coverage line is read by other
tooling and quoted in the README, so what counts as "checked" is pinned here.
"""

from __future__ import annotations

from hotfix_lab.sweep import sweep_families
from hotfix_lab.sweep.sweep_report import compact_results, coverage, load_results, mark_upstream_crashes, render


def test_family_tables_load_once_each_type_in_one_module():
    tables = sweep_families._tables()  # raises on a model type claimed by two modules
    assert set(tables) == {"CONFIGS", "INPUTS", "UNBUILDABLE", "FACTORIES", "VARIANTS"}
    assert len(tables["CONFIGS"]) > 100 and len(tables["INPUTS"]) > 100
    for name in ("CONFIGS", "INPUTS"):
        assert all(callable(fn) for fn in tables[name].values()), name
    for model_type, reason in tables["UNBUILDABLE"].items():
        # a precise one-line mechanism, never "could not build"
        assert reason and "\n" not in reason and "could not" not in reason.lower(), (model_type, reason)


def test_family_modules_import_without_torch_or_transformers():
    import subprocess
    import sys
    from pathlib import Path

    tools = Path(sweep_families.__file__).resolve().parent.parent  # tools/hotfix_lab/sweep
    code = ("import sys, sweep_families; sweep_families._tables(); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(tools), capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def _rows(function, results, on_off=(False, True), model_type="llama"):
    for recipe in ("full", "lora", "lora-input-grads", "frozen-tower"):
        for on in on_off:
            result = "n/a" if recipe == "frozen-tower" else "pass"
            results.append({"model_type": model_type, "recipe": recipe, "hotfix": on, "transformers": "5.23.0",
                            "result": result, "function": function, "class": "LlamaModel"})


def test_coverage_counts_a_type_only_once_every_function_ran_every_recipe(tmp_path):
    results = [{"model_type": "__census__", "transformers": "5.23.0", "checkpointable": ["llama", "bert"],
                "not": [], "unknown": []}]
    _rows("torch", results)
    assert coverage(results, "5.23.0", functions=("torch",))["checked"] == ["llama"]
    assert coverage(results, "5.23.0", functions=("torch", "unsloth"))["checked"] == []  # unsloth not run
    _rows("unsloth", results, on_off=(False,))  # only the unpatched half
    assert coverage(results, "5.23.0", functions=("torch", "unsloth"))["checked"] == []
    _rows("unsloth", results, on_off=(True,))
    assert coverage(results, "5.23.0", functions=("torch", "unsloth"))["checked"] == ["llama"]
    doc = tmp_path / "sweep.md"
    render(results, doc, ["5.23.0"], "2.13.0", functions=("torch", "unsloth"))
    text = doc.read_text()
    assert "coverage 5.23.0: 1/2 model types" in text
    assert "| model type | class | full | lora | lora-input-grads | frozen-tower | full (unsloth) |" in text


def test_rows_written_before_functions_existed_count_as_torch():
    results = [{"model_type": "__census__", "transformers": "5.23.0", "checkpointable": ["llama"]}]
    _rows("torch", results)
    for row in results[1:]:
        del row["function"]
    assert coverage(results, "5.23.0")["checked"] == ["llama"]


def test_a_line_where_unsloth_did_not_run_counts_torch_only_and_shows_no_unsloth_columns(tmp_path):
    results = [{"model_type": "__census__", "transformers": "5.23.0", "checkpointable": ["llama", "bert"]}]
    _rows("torch", results)
    doc = tmp_path / "sweep.md"
    render(results, doc, ["5.23.0"], "2.13.0", functions=("torch", "unsloth"))
    text = doc.read_text()
    assert "coverage 5.23.0: 1/2 model types" in text and "(unsloth)" not in text.split("## transformers")[1]


def test_an_upstream_crash_of_the_step_without_checkpointing_that_hotfix_removes_is_a_checked_failure(tmp_path):
    """GIT's lora-input-grads: upstream's enable_input_require_grads() hook crashes the reference step itself."""
    results = [{"model_type": "__census__", "transformers": "5.23.0", "checkpointable": ["git", "zamba", "bailing"]}]
    for model_type in ("git", "zamba", "bailing"):
        _rows("torch", results, model_type=model_type)
    crash = {"result": "could-not-run", "detail": "RuntimeError: a leaf Variable that requires grad is being used"}
    guard = {"result": "could-not-run", "detail": "memory guard: RSS grew 1.0 GiB during the reference step"}
    for row in results[1:]:
        if row["recipe"] == "lora-input-grads" and (row["model_type"] == "zamba" or not row["hotfix"]):
            # git: hotfix's half ran; zamba: neither half ran (a builder problem); bailing: a guard, not a crash
            row.update(guard if row["model_type"] == "bailing" else crash)
    results = mark_upstream_crashes(results)
    assert coverage(results, "5.23.0")["checked"] == ["git"]
    doc = tmp_path / "sweep.md"
    render(results, doc, ["5.23.0"], "2.13.0")
    git_row = next(line for line in doc.read_text().splitlines() if line.startswith("| git |"))
    assert "**FAIL** → pass" in git_row and "without checkpointing: crash (a leaf Variable" in git_row, git_row
    assert "fixed by hotfix" in git_row, git_row


def test_compacting_the_results_keeps_what_the_report_uses_and_drops_only_superseded_rows(tmp_path):
    import json

    results = [{"model_type": "__census__", "transformers": "5.23.0", "checkpointable": ["llama", "bert"]}]
    _rows("torch", results)
    _rows("torch", results, model_type="bert")
    for row in [r for r in results if r.get("model_type") == "bert" and r.get("recipe") == "lora"]:
        results.append(dict(row, result="could-not-run", detail="first try"))  # superseded below
    _rows("torch", results, model_type="bert")  # a re-run of bert: these rows win
    results += [{"model_type": "__done__", "result": "marker", "transformers": "5.23.0", "hotfix": on,
                 "function": "torch"} for on in (False, True, False)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in results))
    before = tmp_path / "before.md"
    render(load_results(path), before, ["5.23.0"], "2.13.0")
    assert compact_results(path) == 8 + 2 + 1  # bert's first run, its superseded lora rows, a repeated marker
    after = tmp_path / "after.md"
    kept = load_results(path)
    render(kept, after, ["5.23.0"], "2.13.0")
    assert after.read_text() == before.read_text() and "coverage 5.23.0: 2/2" in after.read_text()
    assert len(kept) == 1 + 8 + 8 + 2 and not any(r.get("detail") == "first try" for r in kept)
    assert compact_results(path) == 0  # already compact: the file is left as it is


def test_a_line_heading_says_when_its_rows_ran_not_when_the_page_was_rendered(tmp_path):
    results = [{"model_type": "__census__", "transformers": "5.23.0", "checkpointable": ["llama", "bert"]}]
    _rows("torch", results)
    _rows("torch", results, model_type="bert")
    for i, row in enumerate(results[1:]):
        row.update({"date": "2026-11-2%d" % (i % 2), "torch": "2.13.0+cpu"} if row["model_type"] == "llama"
                   else {"restored": "docs/sweep.md"})
    doc = tmp_path / "sweep.md"
    render(results, doc, ["5.23.0"], "2.13.0+cpu")  # restored rows record no torch: the renderer's is theirs
    heading = next(line for line in doc.read_text().splitlines() if line.startswith("## transformers 5.23.0"))
    assert heading.startswith("## transformers 5.23.0 — run 2026-11-20 to 2026-11-21; 8 of 16 rows restored from an "
                              "earlier page (their run dates not recorded); torch 2.13.0+cpu, CPU — "), heading
    assert not any("run under torch" in line for line in doc.read_text().splitlines() if line.startswith("| "))
    assert "Rows marked `\"restored\": \"docs/sweep.md\"` are not a run's" in doc.read_text()
    assert "Every row is a run's own" not in doc.read_text()
    render([r for r in results if not r.get("restored")], doc, ["5.23.0"], "2.13.0+cpu")  # every row re-run since
    assert "Every row is a run's own" in doc.read_text() and "restored" not in doc.read_text()


def test_a_type_run_under_another_torch_than_its_line_says_so(tmp_path):
    """Gemma-3n runs under torch 2.14.1 (timm needs a torchvision PyPI has for it only), the rest of the line
    under 2.13.0: the heading names both, and that type's row says which it ran under."""
    results = [{"model_type": "__census__", "transformers": "5.23.0", "checkpointable": ["llama", "bert", "gemma3n"]}]
    for model_type, torch_version in (("llama", "2.13.0+cpu"), ("bert", "2.13.0+cpu"), ("gemma3n", "2.14.1+cu130")):
        _rows("torch", results, model_type=model_type)
        for row in results[-8:]:
            row["torch"] = torch_version
    doc = tmp_path / "sweep.md"
    render(results, doc, ["5.23.0"], "2.13.0+cpu")
    lines = doc.read_text().splitlines()
    assert "; torch 2.13.0+cpu, 2.14.1+cu130, CPU — " in next(line for line in lines if line.startswith("## transformers"))
    assert next(line for line in lines if line.startswith("| gemma3n ")).endswith("| run under torch 2.14.1+cu130 |")
    assert not any("run under" in line for line in lines if line.startswith(("| llama ", "| bert ")))


def test_variants_are_extra_rows_of_their_type_never_types_of_the_census():
    from hotfix_lab.sweep.sweep_worker import _model_types

    fix = sweep_families.split_variant("deberta-v2+layer_norm")[1]
    assert callable(fix) and sweep_families.split_variant("deberta-v2") == ("deberta-v2", None)
    with_variants = [name for name, _, _ in _model_types(["deberta-v2"], with_variants=True)]
    assert with_variants == ["deberta-v2", "deberta-v2+layer_norm"]
    assert [name for name, _, _ in _model_types(["deberta-v2"])] == ["deberta-v2"]  # the census's view
    assert all("+" not in name for name, _, _ in _model_types(None))


def test_the_layer_norm_variant_switches_on_the_keyword_tensor_path():
    from transformers import DebertaV2Config

    config = DebertaV2Config()
    sweep_families.split_variant("deberta-v2+layer_norm")[1](config)
    assert config.relative_attention and config.norm_rel_ebd == "layer_norm"


def test_a_lora_recipe_whose_adapters_never_run_is_not_applicable_rather_than_a_vacuous_pass():
    """VideoMAE 4.x computes q/v as F.linear(x, self.query.weight, ...): PEFT's adapters are never called,
    so no adapter gets a gradient even without checkpointing.  "8/8 equal" (None == None) would be a pass
    that compared nothing, and without enable_input_require_grads() the loss does not even need grad."""
    from hotfix.diagnostics.results import CheckReport, ModeResult
    from hotfix_lab.sweep.sweep_worker import _adapters_never_run

    def report(reference, without):
        names = ["a.lora_A.weight", "a.lora_B.weight"]
        return CheckReport(model="M", reference=reference, modes=[], parameters=names, tolerance={}, floor=1e-3,
                           versions={}, hotfix_active=True, memory_limit=0, without_gradient=without)

    ran = ModeResult(mode="none", status="reference")
    assert _adapters_never_run(report(ran, ["a.lora_A.weight", "a.lora_B.weight"]))
    assert not _adapters_never_run(report(ran, ["a.lora_A.weight"]))  # one adapter runs: a real comparison
    assert not _adapters_never_run(report(ran, []))
    cut = ModeResult(mode="none", status="error",
                     error="CheckerError: the loss does not require grad without checkpointing: nothing to check")
    assert _adapters_never_run(report(cut, []))
    assert not _adapters_never_run(report(ModeResult(mode="none", status="error", error="RuntimeError: boom"), []))


def test_the_tracked_store_is_one_deterministic_gzip_per_line_and_merges_a_pending_run(tmp_path):
    """docs/sweep-results/: a run appends to .sweep/<store>.pending.jsonl; compacting keeps the last row per
    cell and writes one gzip file per release line, byte-identical when nothing changed."""
    import json

    from hotfix_lab.sweep import sweep_store

    store = tmp_path / "docs" / "sweep-results"
    pending = sweep_store.append_target(store)
    assert pending == tmp_path / ".sweep" / "sweep-results.pending.jsonl"
    pending.parent.mkdir()
    rows = [{"model_type": "llama", "recipe": "full", "hotfix": True, "transformers": v, "result": r,
             "function": "torch"} for v, r in (("4.56.2", "fail"), ("5.23.0", "pass"), ("4.56.2", "pass"))]
    pending.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert len(load_results(store)) == 3  # the store is empty, the pending run is read
    assert compact_results(store) == 1  # the superseded 4.56.2 row
    assert not pending.exists()
    assert sorted(p.name for p in store.iterdir()) == ["4.56.2.jsonl.gz", "5.23.0.jsonl.gz"]
    first = {p.name: p.read_bytes() for p in store.iterdir()}
    assert [r["result"] for r in load_results(store) if r["transformers"] == "4.56.2"] == ["pass"]
    pending.write_text(json.dumps(rows[1]) + "\n")  # a re-run that changes nothing
    compact_results(store)
    assert {p.name: p.read_bytes() for p in store.iterdir()} == first


def test_a_full_sweep_run_adds_less_than_512_kB_to_git():
    """A run rewrites at most every release line's gzip file and the page; git stores each compressed.  Rows of a
    run carry every mode's counts and errors (4.56.2's 6021 rows, run 2026-11-27: 98 kB; restored from the page
    they were 33 kB), so three lines of 6,000 - 9,700 rows and the page stay near 400 kB."""
    import zlib

    from conftest import REPO

    store = sum(path.stat().st_size for path in (REPO / "docs" / "sweep-results").glob("*.jsonl.gz"))
    page = len(zlib.compress((REPO / "docs" / "sweep.md").read_bytes(), 9))
    assert store + page < 512 * 1024, (store, page)


def test_the_page_is_what_the_tracked_rows_render_and_every_hand_note_is_read(tmp_path):
    """docs/sweep.md is re-derivable from docs/sweep-results/ alone (issue 34): rendered again from the rows it
    is the same page, byte for byte; and every hand-written note (OUT_OF_SCOPE) is on it, read by some cell still
    failing with hotfix (a note the float64 re-check made needless is removed, not left to rot)."""
    from conftest import REPO
    from packaging.version import Version
    from hotfix_lab.sweep.sweep_report import OUT_OF_SCOPE, RECIPE_ORDER
    from hotfix_lab.sweep.sweep_worker import FUNCTION_MODES

    rows = load_results(REPO / "docs" / "sweep-results")
    assert all(r.get("torch") for r in rows if not r["model_type"].startswith("__")), "a row without its torch"
    doc = tmp_path / "sweep.md"
    render(rows, doc, sorted({r["transformers"] for r in rows}, key=Version), "no torch recorded",
           list(RECIPE_ORDER), list(FUNCTION_MODES))
    page = (REPO / "docs" / "sweep.md").read_text()
    assert doc.read_text() == page, "docs/sweep.md differs from what docs/sweep-results/ renders: re-render it"
    unread = [t for t, note in OUT_OF_SCOPE.items() if f"out of scope: {note}" not in page]
    assert not unread, unread
