"""A real Jupyter kernel (nbclient + ipykernel), as on Colab where seed 000's user trained.

The kernel starts with HOTFIX_DISABLE=1, so hotfix's start-up hook stays inert
in it: exactly a kernel that was running before hotfix was installed.  Cells:

1. import transformers, build a tiny Whisper, enable (reentrant) checkpointing,
   take the reference gradients without checkpointing;
2. one step: the seed's crash (upstream, nothing of hotfix loaded);
3. ``%pip install`` the hotfix wheel into a folder, put it on sys.path, clear
   HOTFIX_DISABLE with ``%env``, ``import hotfix``;
4. one step on the *same* model object: gradients equal the reference.
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO, TOOLS

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

CELLS = [
    """
import sys, json, torch
import transformers  # the lab: tools/ on the kernel's PYTHONPATH
from hotfix_lab.infra import tiny_models
from hotfix_lab.infra import standalone
compare = standalone.load("compare")  # hotfix's comparison rule, without importing hotfix
model, batch = tiny_models.whisper(0)
def grads():
    return compare.collect_grads(model)
model(**batch).loss.backward(); reference = grads()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{"use_reentrant": True}})
def step():
    model.zero_grad(set_to_none=True)
    try:
        model(**batch).loss.backward()
    except RuntimeError as exc:
        return compare.short_error(exc)
    return compare.compare_grads(reference, grads()).ok
""",
    "print(json.dumps({{'before': step(), 'hotfix_modules': sorted(m for m in sys.modules if m.startswith('hotfix') and not m.startswith('hotfix_lab'))}}))",
    """
%pip install -q --no-deps --no-index --target {site} {wheel}
%env HOTFIX_DISABLE=0
sys.path.insert(0, {site!r})
import hotfix
""",
    "print(json.dumps({{'after': step(), 'hotfix_file': hotfix.__file__}}))",
]


def _kernel_spec(root, env):
    spec = root / "kernels" / "hotfix-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "hotfix test", "language": "python", "env": env,
    }))
    return root


def test_import_hotfix_in_a_running_kernel_fixes_the_built_model(tmp_path, monkeypatch):
    wheel = next((REPO / "dist").glob("hotfix_checkpoint-*.whl"))  # built by scripts/test.sh
    site = tmp_path / "pip-target"
    jupyter = _kernel_spec(tmp_path / "jupyter", {"HOTFIX_DISABLE": "1", "OMP_NUM_THREADS": "1",
                                                  "PYTHONPATH": str(TOOLS)})
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(c.format(site=str(site), wheel=str(wheel)).strip())
                      for c in CELLS]
    client = nbclient.NotebookClient(notebook, kernel_name="hotfix-test", timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    printed = [json.loads(out["text"].strip().splitlines()[-1]) for cell in notebook.cells
               for out in cell.get("outputs", []) if out.get("name") == "stdout" and out["text"].strip().startswith("{")]
    before, after = printed
    assert "Trying to backward through the graph a second time" in before["before"], before
    assert before["hotfix_modules"] == [], before
    assert after["after"] is True, after
    assert after["hotfix_file"].startswith(str(site)), after
