"""What ships, how a release is built, and how a checkout is used.

* A release is built as PyPI's pipelines build it: ``python -m build`` makes the sdist
  from a clean copy of the repository's files, then the wheel *from that sdist*; both
  pass ``twine check``.  The sdist once lacked the start-up files, and the wheel could
  not be built from it ("can't copy 'boot/hotfix-checkpoint.pth'"); setup.py now writes
  them from hotfix/startup/boot.py, which the sdist carries as a module of the package.
* The wheel holds the product only: hotfix/ (API, activation, core, the checkpoint engine,
  diagnostics), hotfix/patches/ (the fixes, one module each), the start-up hook and its
  two start-up files.  No test fixture, simulated device, lab model or checkout
  loader: every file is matched against an allow-list.
* One hotfix, from a checkout or installed.  The checkout keeps ``patches/`` beside
  ``hotfix/`` (the wheel maps it to ``hotfix.patches``): a script run from the
  checkout's root with the wheel installed runs the installed copy with every fix (it
  used to load the checkout's ``hotfix/`` and no fix at all), and a checkout that is
  not installed finds exactly the fixes of pyproject's entry-point table.
* A checkout is used through ``pip install -e .``: the start-up files come with it
  (setup.py writes the editable install's own .pth), so the first import of
  transformers activates hotfix from the checkout, and ``python -m hotfix`` run from
  the repository root finds every fix.  Moved or deleted afterwards, the checkout
  costs one line at each interpreter start, not a traceback (twice).
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from pathlib import Path
from typing import Dict

import pytest

from conftest import (FINDER_ARMED, PRELUDE, REPO, checkout_build, clean_env, dependencies, hotfix_lines, json_lines,
                      run_python)

#: every file of the wheel matches one of these (dist-info aside)
ALLOWED = (
    "hotfix/*.py",
    "hotfix/checkpointing/*.py",
    "hotfix/checkpointing/offload/*.py",
    "hotfix/diagnostics/*.py",
    "hotfix/patches/*.py",
    "_hotfix_boot.py",
    "hotfix_state.py",  # the in-process check (hotfix/startup/state.py): importing it activates nothing
    "hotfix-checkpoint.pth",
    "hotfix-checkpoint.start",
)
#: names that belong to the tests or the lab, never to users' environments
NEVER = ("tiny_models", "simulated", "sanitizer", "checkout", "standalone", "zoo_loader", "conftest", "test_")
STARTUP_FILES = ("_hotfix_boot.py", "hotfix-checkpoint.pth", "hotfix-checkpoint.start")
SITE = sysconfig.get_paths()["purelib"]  # the test venv's: torch and transformers


def pyproject_fixes() -> Dict[str, str]:
    """pyproject.toml's entry-point table of the built-in fixes: name -> module:attr."""
    with open(REPO / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["entry-points"]["hotfix.patches"]


def clean_copy(dest: Path) -> Path:
    """The repository's files as a commit of this work tree holds them (tracked, and new files
    not ignored): no venv, build output, cache or egg-info."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():  # a tracked file deleted in the work tree is gone from the next commit too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    return clean_copy(tmp_path_factory.mktemp("clone"))


@pytest.fixture(scope="module")
def release(clone, tmp_path_factory) -> Dict[str, Path]:
    """``python -m build``: the sdist from the clean copy, then the wheel from that sdist.

    --no-isolation: the test venv's setuptools and wheel (scripts/test.sh), nothing downloaded;
    the flow is a release's all the same.
    """
    out = tmp_path_factory.mktemp("dist")
    env = clean_env()
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(clone)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sdist,), (wheel,) = list(out.glob("hotfix_checkpoint-*.tar.gz")), list(out.glob("hotfix_checkpoint-*.whl"))
    return {"sdist": sdist, "wheel": wheel}


def installed_site(wheel: Path, dest: Path) -> Path:
    """A site directory holding the wheel as pip installs it (a pure wheel unpacks as it is)."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(dest)
    return dest


# --------------------------------------------------------------------------- the release
def test_release_builds_the_wheel_from_the_sdist(release):
    """The sdist carries the start-up files, the wheel built from it ships them at the root of
    site-packages with every fix of pyproject's table as a ``hotfix.patches`` module, and
    ``twine check --strict`` passes on both."""
    import tarfile

    with tarfile.open(release["sdist"]) as archive:
        sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"setup.py", "hotfix/startup/boot.py"} <= sdist, sorted(sdist)  # what setup.py writes them from
    wheel = set(zipfile.ZipFile(release["wheel"]).namelist())
    fixes = {"hotfix/patches/%s.py" % value.split(":")[0].rsplit(".", 1)[1] for value in pyproject_fixes().values()}
    assert set(STARTUP_FILES) | fixes | {"hotfix/patches/__init__.py"} <= wheel, sorted(wheel)
    proc = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(release["sdist"]),
                           str(release["wheel"])], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_wheel_ships_the_product_only(release):
    names = [n for n in zipfile.ZipFile(release["wheel"]).namelist() if ".dist-info/" not in n]
    outside = [n for n in names if not any(fnmatch.fnmatch(n, pattern) for pattern in ALLOWED)]
    assert outside == [], outside
    lab = [n for n in names if any(word in n.rsplit("/", 1)[-1] for word in NEVER)]
    assert lab == [], lab
    for required in ("hotfix/__init__.py", "hotfix/auto.py", "hotfix/patch.py", "hotfix/registry.py",
                     "hotfix/diagnostics/doctor_models.py", "hotfix/patches/transformers_checkpoint_layer_io.py",
                     "_hotfix_boot.py", "hotfix_state.py", "hotfix-checkpoint.pth", "hotfix-checkpoint.start"):
        assert required in names, (required, names)


# --------------------------------------------------------------------------- one hotfix, checkout or installed
FROM_THE_CHECKOUT = """
    import site
    site.addsitedir(sys.argv[1])  # the installed wheel: its .pth starts the hook
    sys.path.append(sys.argv[2])  # torch and transformers, as a plain path
    first = sys.path[0]
    import transformers
    model, batch = tiny_whisper()
    reference = reference_grads(model, batch)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    hotfix = sys.modules.get("hotfix")
    report(first=os.path.abspath(first), hotfix=hotfix and hotfix.__file__, step=step(model, batch, reference),
           fixes=sorted(hotfix.registry.patches()) if hotfix else None)
"""


def test_script_run_from_the_checkout_root_runs_the_installed_fixes(release, clone, tmp_path):
    """``pip install .``, then ``python -c ...`` in the checkout's root (the checkout is sys.path[0]),
    Whisper with reentrant checkpointing: the start-up hook loads the installed copy, every fix
    loads, the gradients equal those without checkpointing, and nothing is printed.  It used to load
    the checkout's ``hotfix/``: five "could not be loaded ... No module named 'hotfix.patches'"
    and the seed's crash."""
    site = installed_site(release["wheel"], tmp_path / "site")
    proc = run_python(["-S", "-c", PRELUDE + textwrap.dedent(FROM_THE_CHECKOUT), str(site), SITE],
                      cwd=clone, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json_lines(proc.stdout)[0]
    assert seen["first"] == str(clone), seen  # the checkout's hotfix/ was first in line
    assert seen == {"first": str(clone), "hotfix": str(site / "hotfix" / "__init__.py"),
                    "step": {"ok": True, "grads_match": True}, "fixes": sorted(pyproject_fixes())}, proc.stderr
    assert hotfix_lines(proc.stderr) == [], proc.stderr


def test_a_checkout_that_is_not_installed_finds_every_fix(clone, tmp_path):
    """``python -m hotfix status --no-import`` in a checkout where hotfix-checkpoint is not
    installed (no metadata declares its entry points) lists exactly pyproject's fixes, from
    hotfix-checkpoint; it used to list none."""
    env = clean_env()
    env["PYTHONPATH"] = str(dependencies(tmp_path / "deps"))
    proc = subprocess.run([sys.executable, "-S", "-m", "hotfix", "status", "--no-import"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = [line.strip() for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert [line.split(":")[0] for line in listed] == sorted(pyproject_fixes()), proc.stdout
    assert all(line.endswith("(from hotfix-checkpoint)") for line in listed), proc.stdout
    assert hotfix_lines(proc.stderr) == [], proc.stderr


def test_the_checkout_rule_for_built_in_fixes_is_pyproject_table():
    """Where no metadata declares them, hotfix finds its own fixes by a rule (each public module
    of hotfix.patches, named as the module, its ``patch``): the rule yields pyproject's table,
    names and values, so the table stays the one declaration."""
    from hotfix.registry import built_in_fixes

    assert built_in_fixes() == pyproject_fixes()


@pytest.mark.parametrize("where", ["installed", "checkout"])
def test_a_built_in_fix_that_fails_to_load_is_named_a_fix(release, clone, tmp_path, where):
    """A built-in fix whose module raises on import: one line "hotfix: fix 'NAME' (module:attr)
    could not be loaded", not "plugin patch" (third-party fixes are "third-party fix ... from
    distribution D", tests/e2e/test_activation_api.py)."""
    if where == "installed":
        root = installed_site(release["wheel"], tmp_path / "site")
        broken = root / "hotfix" / "patches" / "unsloth_zoo_closure_tensors.py"
        probe = "import site, sys; site.addsitedir(sys.argv[1]); import hotfix"
    else:
        root = tmp_path / "checkout"
        for folder in ("hotfix", "patches"):
            shutil.copytree(clone / folder, root / folder)
        broken = root / "patches" / "unsloth_zoo_closure_tensors.py"
        probe = "import sys; sys.path.insert(0, sys.argv[1]); import hotfix"
    broken.write_text(broken.read_text() + "\nraise ImportError('broken on purpose')\n")
    env = clean_env()
    env["PYTHONPATH"] = str(dependencies(tmp_path / "deps"))
    proc = subprocess.run([sys.executable, "-S", "-c", probe, str(root)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert hotfix_lines(proc.stderr) == [
        "hotfix: fix 'unsloth-zoo-closure-tensors' (hotfix.patches.unsloth_zoo_closure_tensors:patch) could not "
        "be loaded and is skipped: ImportError('broken on purpose')"], proc.stderr


# --------------------------------------------------------------------------- editable installs
FAKE_TRANSFORMERS = "TRIGGERED = True\n"


@pytest.fixture(scope="module")
def dev_venv(tmp_path_factory):
    """A venv with only what an editable install of hotfix needs, from PyPI as a developer would get it."""
    venv = tmp_path_factory.mktemp("dev") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    env = clean_env()
    env.pop("PYTHONPATH", None)
    # setuptools/wheel for the editable build; wrapt/packaging for hotfix
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "setuptools>=77",
                              "wheel", "wrapt>=1.14", "packaging>=21"], capture_output=True, text=True, timeout=600,
                             env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    return python, env


def install_editable(dev_venv, checkout: Path) -> None:
    python, env = dev_venv
    with checkout_build():  # the build writes into the checkout (egg-info), the GPU kit's too
        editable = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                                   str(checkout)], capture_output=True, text=True, timeout=600, env=env)
    assert editable.returncode == 0, editable.stderr[-3000:]


def test_editable_install_starts_up_like_an_install(dev_venv, tmp_path):
    """A venv with only wrapt and packaging, ``pip install -e <checkout>``: a fake ``transformers``
    (a trigger of the start-up hook) activates hotfix from the checkout, and ``python -m hotfix status``
    from the repository root lists every built-in fix as loaded from hotfix-checkpoint."""
    python, env = dev_venv
    install_editable(dev_venv, REPO)
    fake = tmp_path / "fake"
    (fake / "transformers").mkdir(parents=True)
    (fake / "transformers" / "__init__.py").write_text(FAKE_TRANSFORMERS)
    env = dict(env, PYTHONPATH=str(fake))
    probe = (f"import sys; armed = {FINDER_ARMED}; "
             "import transformers; h = sys.modules.get('hotfix'); "
             "print(armed, h is not None and h.registry.active, h and h.__file__)")
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                          cwd=str(tmp_path))
    assert proc.stdout.split() == ["True", "True", str(REPO / "hotfix" / "__init__.py")], proc.stdout + proc.stderr
    status = subprocess.run([python, "-m", "hotfix", "status", "--no-import"], capture_output=True, text=True,
                            timeout=120, env=env, cwd=str(REPO))
    assert status.returncode == 0, status.stderr
    fixes = [line for line in status.stdout.splitlines() if line.startswith("  ")]
    assert len(fixes) == len(pyproject_fixes()), status.stdout
    assert all(line.endswith("(from hotfix-checkpoint)") for line in fixes), status.stdout
    assert "failed to load" not in status.stdout + status.stderr


def test_editable_install_whose_checkout_is_gone_is_one_line(dev_venv, tmp_path):
    """``pip install -e CHECKOUT``, then the checkout is moved: every interpreter of the venv
    (pip's too) says so in one ``hotfix:`` line and runs on; it used to print site's
    "Error processing line 1" with a traceback, twice (a venv's lib64 link has site read
    the .pth twice)."""
    python, env = dev_venv
    checkout = clean_copy(tmp_path / "checkout")
    install_editable(dev_venv, checkout)
    checkout.rename(tmp_path / "moved")
    for args in (["-c", "print('ran')"], ["-m", "pip", "--version"]):
        proc = subprocess.run([python, *args], capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and "Error processing" not in proc.stderr, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("hotfix: hotfix-checkpoint is installed in editable mode from "
                                                       f"{checkout}, but"), proc.stderr
        assert "is missing" in lines[0] and "pip install -e" in lines[0], lines
