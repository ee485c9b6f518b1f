"""Odd version metadata never switches hotfix off in silence.

Three ways it used to: a transformers dist-info without ``METADATA``
(``importlib.metadata.version()`` returns None, it does not raise: "not
installed", nothing applied, Whisper crashed), a version that does not parse
("cannot be compared", nothing applied), and metadata saying 5.0.0 while the
code on sys.path is 4.56.2 (status showed 5.0.0, no hint).  Now both sources
are read (``hotfix.versions``), the imported code's ``__version__`` decides
when it parses, disagreements are one log line and a note in ``status``, and
where no version can be read at all the drift check (the target's code)
decides.
"""

from __future__ import annotations

import shutil
import sysconfig
import textwrap
from pathlib import Path

import pytest

from conftest import hotfix_lines, json_lines, run_python

SITE = Path(sysconfig.get_paths()["purelib"])


@pytest.mark.parametrize(
    "metadata_version, module_version, decided, problem",
    [
        ("4.56.2", "4.56.2", "4.56.2", None),
        ("4.56.2", None, "4.56.2", None),  # not imported yet: metadata alone is fine
        (None, "4.56.2", "4.56.2", "no readable metadata version"),
        ("not-a-version", "4.56.2", "4.56.2", "metadata says 'not-a-version'"),
        ("5.0.0", "4.56.2", "4.56.2", "metadata says '5.0.0' but the imported module's __version__ is '4.56.2'"),
        ("2.14.1", "2.14.1+cu130", "2.14.1+cu130", None),  # PyPI's torch: build label in __version__ only
        ("2.14.1+cpu", "2.14.1+cu130", "2.14.1+cu130", "metadata says '2.14.1+cpu'"),  # two different builds
        ("not-a-version", None, None, "cannot be read"),
        ("weird", "odd", None, "using neither"),
        (None, None, None, "cannot be read"),
    ],
)
def test_evidence_decides_from_the_best_source(metadata_version, module_version, decided, problem):
    from hotfix.versions import VersionEvidence

    evidence = VersionEvidence("transformers", True, metadata_version, module_version)
    assert evidence.version == decided
    if problem is None:
        assert evidence.problem() is None
    else:
        assert problem in evidence.problem()
        assert "!" in evidence.describe()


def test_not_installed_is_no_problem():
    from hotfix.versions import VersionEvidence

    evidence = VersionEvidence("unsloth", False, None, None)
    assert evidence.problem() is None and evidence.describe() == "not installed"


# One child: train Whisper (4.56.2, reentrant) and print `hotfix status`.
CHILD = textwrap.dedent(
    """
    import contextlib, io, json
    import torch, transformers
    from hotfix_lab.infra import tiny_models
    model, batch = tiny_models.whisper(0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    try:
        model(**batch).loss.backward()
        trains = True
    except RuntimeError as exc:
        trains = str(exc).splitlines()[0][:60]
    from hotfix.cli import status
    buffer = io.StringIO()
    status(out=buffer)
    print(json.dumps({"trains": trains, "status": buffer.getvalue()}))
    """
)


def _dist_info(tmp_path, edit):
    folder = tmp_path / "shadow-metadata"
    source = next(SITE.glob("transformers-*.dist-info"))
    shutil.copytree(source, folder / source.name)
    edit(folder / source.name / "METADATA")
    return folder


CASES = {
    "METADATA missing": (lambda path: path.unlink(), "no readable metadata version"),
    "version not-a-version": (lambda path: path.write_text(path.read_text().replace("Version: 4.56.2", "Version: not-a-version", 1)),
                              "metadata says 'not-a-version'"),
    # read while transformers' own import runs (a fix's torch target is imported from it: no __version__ yet), the
    # module's side is the metadata installed beside it; read after, its __version__: either says 4.56.2
    "metadata says 5.0.0": (lambda path: path.write_text(path.read_text().replace("Version: 4.56.2", "Version: 5.0.0", 1)),
                            "metadata says '5.0.0' but the imported module's "),
}


@pytest.mark.parametrize("case", list(CASES))
def test_odd_transformers_metadata_still_fixes_whisper(tmp_path, case):
    edit, phrase = CASES[case]
    shadow = _dist_info(tmp_path, edit)
    proc = run_python(["-c", CHILD], pythonpath=[shadow], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json_lines(proc.stdout)[0]
    assert seen["trains"] is True, seen
    status = seen["status"]
    assert "transformers 4.56.2  (! " in status and phrase in status, status
    applied = next(line for line in status.splitlines() if "transformers-checkpoint-layer-io:" in line)
    assert "APPLIED to" in applied and "transformers.modeling_layers" in applied, status
    lines = hotfix_lines(proc.stderr)
    assert len(lines) == 1 and phrase in lines[0], proc.stderr  # one line per library, not per patch


PLUGIN = '''
from hotfix import Patch

class Probe(Patch):
    targets = ("probe_lib",)
    affected = {"probe-lib": ">=1.0"}
    def __init__(self, name, shape_ok):
        super().__init__()
        self.name, self.shape_ok = name, shape_ok
    def drift(self, module):
        return None if self.shape_ok else "probe_lib.thing has another shape"
    def _apply(self, module):
        self.replace(module, "thing", "patched")

matching = Probe("probe-matching", True)
drifted = Probe("probe-drifted", False)
'''


def test_unreadable_version_leaves_the_decision_to_the_code(tmp_path):
    """Neither metadata nor ``__version__`` parses: a patch is applied where its
    drift check finds the affected shape, and skipped (one line) where not."""
    (tmp_path / "probe_lib.py").write_text("__version__ = 'weird'\nthing = 'original'\n")
    (tmp_path / "probe_plugin.py").write_text(PLUGIN)
    info = tmp_path / "probe_lib-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: probe-lib\nVersion: not-a-version\n")
    (info / "entry_points.txt").write_text(
        "[hotfix.patches]\nprobe-matching = probe_plugin:matching\nprobe-drifted = probe_plugin:drifted\n")
    probe = ("import json, hotfix, probe_lib; ps = hotfix.known_patches(); "
             "print(json.dumps({'thing': probe_lib.thing, 'matching': ps['probe-matching'].applied, "
             "'drifted': ps['probe-drifted'].applied, 'reason': ps['probe-matching'].check().reason}))")
    proc = run_python(["-c", probe], pythonpath=[tmp_path], timeout=120)
    seen = json_lines(proc.stdout)[0]
    assert seen["thing"] == "patched" and seen["matching"] is True and seen["drifted"] is False, (seen, proc.stderr)
    assert "version unknown" in seen["reason"] and "drift check" in seen["reason"], seen
    lines = hotfix_lines(proc.stderr)
    assert any("probe-lib version cannot be read" in l or "using neither" in l for l in lines), proc.stderr
    assert len([l for l in lines if "probe-drifted skipped" in l]) == 1, proc.stderr


DEEPSPEED_GATE = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import importlib.metadata, deepspeed, hotfix_state
    print(json.dumps({"metadata": importlib.metadata.version("deepspeed"), "imported": deepspeed.__version__,
                      "applied": hotfix_state.applied().get("deepspeed-zero3-frozen-recompute")}))
    """
)


def test_deepspeed_gate_reads_the_release_imported_not_the_first_metadata(tmp_path):
    """DeepSpeed imports its checkpointing module (the fix's target) before it sets ``deepspeed.__version__``, so
    the gate read the metadata first on sys.path alone: a 0.19.2 first on PYTHONPATH with 0.19.8's metadata found
    first got "not needed here" and kept the crash.  Now the metadata beside the imported package decides (one line
    names the disagreement)."""
    from conftest import matrix_path

    old, new = matrix_path("deepspeed", "0.19.2"), matrix_path("deepspeed", "0.19.8")
    metadata_only = tmp_path / "metadata-only"
    shutil.copytree(new / "deepspeed-0.19.8.dist-info", metadata_only / "deepspeed-0.19.8.dist-info")
    proc = run_python(["-c", DEEPSPEED_GATE], pythonpath=[metadata_only, old], timeout=300)
    (seen,) = json_lines(proc.stdout)
    assert (seen["metadata"], seen["imported"]) == ("0.19.8", "0.19.2"), seen
    assert seen["applied"] == ["torch.utils.checkpoint"], proc.stderr[-2000:]
    assert any("deepspeed metadata says '0.19.8' but the imported module's metadata beside it is '0.19.2'" in line
               for line in hotfix_lines(proc.stderr)), proc.stderr[-2000:]
