"""What ships, and how a checkout is used.

* The wheel holds the product only: hotfix/ (API, activation, core, diagnostics),
  hotfix/patches/ (the fixes and their private helpers), the start-up hook and its
  two start-up files.  No test fixture, simulated device, lab model or checkout
  loader: every file is matched against an allow-list.
* A checkout is used through ``pip install -e .``: the start-up files come with it
  (setup.py writes the editable install's own .pth), so the first import of
  transformers activates hotfix from the checkout, and ``python -m hotfix`` run from
  the repository root finds every fix.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import zipfile

from conftest import REPO, clean_env

#: every file of the wheel matches one of these (dist-info aside)
ALLOWED = (
    "hotfix/*.py",
    "hotfix/diagnostics/*.py",
    "hotfix/patches/*.py",
    "_hotfix_boot.py",
    "hotfix-checkpoint.pth",
    "hotfix-checkpoint.start",
)
#: names that belong to the tests or the lab, never to users' environments
NEVER = ("tiny_models", "simulated", "sanitizer", "checkout", "standalone", "zoo_loader", "conftest", "test_")


def _build_wheel(out) -> zipfile.ZipFile:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                           str(out), str(REPO)], capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = list(out.glob("hotfix_checkpoint-*.whl"))
    assert len(wheels) == 1, wheels
    return zipfile.ZipFile(wheels[0])


def test_the_wheel_ships_the_product_only(tmp_path):
    names = [n for n in _build_wheel(tmp_path).namelist() if ".dist-info/" not in n]
    outside = [n for n in names if not any(fnmatch.fnmatch(n, pattern) for pattern in ALLOWED)]
    assert outside == [], outside
    lab = [n for n in names if any(word in n.rsplit("/", 1)[-1] for word in NEVER)]
    assert lab == [], lab
    for required in ("hotfix/__init__.py", "hotfix/auto.py", "hotfix/patch.py", "hotfix/registry.py",
                     "hotfix/diagnostics/doctor_models.py", "hotfix/patches/transformers_checkpoint_layer_io.py",
                     "_hotfix_boot.py", "hotfix-checkpoint.pth", "hotfix-checkpoint.start"):
        assert required in names, (required, names)


FAKE_TRANSFORMERS = "TRIGGERED = True\n"


def test_editable_install_starts_up_like_an_install(tmp_path):
    """A venv with only wrapt and packaging, ``pip install -e <checkout>``: a fake ``transformers``
    (a trigger of the start-up hook) activates hotfix from the checkout, and ``python -m hotfix status``
    from the repository root lists every built-in fix as loaded from hotfix-checkpoint."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    env = clean_env()
    env.pop("PYTHONPATH", None)
    # setuptools/wheel for the editable build; wrapt/packaging for hotfix (PyPI, as a developer would)
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "setuptools>=69",
                              "wheel", "wrapt>=1.14", "packaging>=21"], capture_output=True, text=True, timeout=600,
                             env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    editable = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                               str(REPO)], capture_output=True, text=True, timeout=600, env=env)
    assert editable.returncode == 0, editable.stderr[-3000:]
    fake = tmp_path / "fake"
    (fake / "transformers").mkdir(parents=True)
    (fake / "transformers" / "__init__.py").write_text(FAKE_TRANSFORMERS)
    env["PYTHONPATH"] = str(fake)
    probe = ("import sys; armed = any(type(f).__name__ == 'ActivateOnFirstImport' for f in sys.meta_path); "
             "import transformers; h = sys.modules.get('hotfix'); "
             "print(armed, h is not None and h.registry.active, h and h.__file__)")
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                          cwd=str(tmp_path))
    assert proc.stdout.split() == ["True", "True", str(REPO / "hotfix" / "__init__.py")], proc.stdout + proc.stderr
    status = subprocess.run([python, "-m", "hotfix", "status", "--no-import"], capture_output=True, text=True,
                            timeout=120, env=env, cwd=str(REPO))
    assert status.returncode == 0, status.stderr
    fixes = [line for line in status.stdout.splitlines() if line.startswith("  ")]
    assert len(fixes) == 5 and all(line.endswith("(from hotfix-checkpoint)") for line in fixes), status.stdout
    assert "failed to load" not in status.stdout + status.stderr
