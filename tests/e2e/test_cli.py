"""The command line a user meets first: `hotfix doctor` (the README's main job), `python -m hotfix`, and what
`hotfix status` says where it runs (a `pip install --target` folder, a plugin it cannot read, a closed pipe)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, clean_env, hotfix_lines, plugin_dir, run_python


def _hotfix_command() -> str:
    script = Path(sys.executable).with_name("hotfix")
    assert script.exists(), "the wheel installs a `hotfix` console script"
    return str(script)


def test_doctor_reproduces_and_fixes_on_4_56_2():
    """`hotfix doctor` crashes the tiny Whisper without hotfix, trains it with, exit 0."""
    proc = subprocess.run([_hotfix_command(), "doctor"], env=clean_env(), cwd=str(REPO),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "without hotfix (HOTFIX_DISABLE=1): CRASH   RuntimeError: Trying to backward through the graph a second time" in out
    assert "with hotfix:                       TRAINS" in out
    assert "84 missing" in out  # frozen decoder embeddings: silent gradient loss upstream
    assert "verdict: this environment has the bug, and hotfix fixes it." in out


def test_doctor_runs_its_cases_on_the_transformers_this_python_imports(tmp_path):
    """Issue 41, part 5: with a relative ``PYTHONPATH`` (``PYTHONPATH=tf``, transformers 5.23.0 there) the user's
    Python imports 5.23.0, but `hotfix doctor` ran its cases on the venv's 4.56.2 (its children start in the
    temporary folder, where ``tf`` is nothing) and gave a verdict about the wrong install.  Its children now import
    from exactly the caller's ``sys.path``; the doctor says which transformers and torch, from where."""
    from conftest import matrix_path

    (tmp_path / "tf").symlink_to(matrix_path("transformers", "5.23.0"))
    env = clean_env({"PYTHONPATH": "tf"})
    mine = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"], env=env,
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert mine.stdout.strip() == "5.23.0", mine.stderr
    proc = subprocess.run([_hotfix_command(), "doctor"], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=900)
    assert f"transformers 5.23.0 (from {tmp_path / 'tf'})" in proc.stdout, proc.stdout + proc.stderr
    assert "4.56.2" not in proc.stdout, proc.stdout


def test_python_dash_m_hotfix_defaults_to_status():
    """`python -m hotfix` prints the status report without importing targets when asked."""
    proc = run_python(["-m", "hotfix", "status", "--no-import"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "transformers-checkpoint-layer-io" in proc.stdout
    assert "HOTFIX_DISABLE=''" in proc.stdout
    # the test venv's editable install has its start-up .pth in site-packages
    assert proc.stdout.splitlines()[1].startswith("start-up hook: in effect ("), proc.stdout
    proc = run_python(["-m", "hotfix"], timeout=300)
    assert proc.returncode == 0 and "libraries:" in proc.stdout


def test_doctor_verdict_holds_under_pythonwarnings_error():
    """Under ``PYTHONWARNINGS=error`` the doctor's own bookkeeping (the loss as a
    float) must not turn into a false "still broken" verdict."""
    proc = subprocess.run([_hotfix_command(), "doctor"], env=clean_env({"PYTHONWARNINGS": "error"}), cwd=str(REPO),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ERROR" not in proc.stdout, proc.stdout
    assert "with hotfix:                       TRAINS" in proc.stdout, proc.stdout
    assert "verdict: this environment has the bug, and hotfix fixes it." in proc.stdout, proc.stdout


def _bare_venv(tmp_path: Path) -> str:
    """A venv without pip or hotfix, holding only hotfix's two dependencies (the test venv's wrapt, packaging)."""
    import packaging
    import wrapt

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site_packages = next((venv / "lib").glob("python*/site-packages"))
    for module in (wrapt, packaging):
        package = Path(module.__file__).parent
        shutil.copytree(package, site_packages / package.name)
    return str(venv / "bin" / "python")


def test_a_target_install_on_pythonpath_says_its_start_up_hook_is_not_in_effect(tmp_path):
    """Issue 31 item 8: ``pip install --target DIR`` + ``PYTHONPATH=DIR`` puts every file in place, but Python
    runs .pth files only from site directories: a script that never imports hotfix runs unpatched, while
    ``hotfix status`` (which imports hotfix) said "active ... APPLIED".  It now says the hook is not in effect,
    what that means and the remedy; with the remedy (a sitecustomize importing hotfix.auto) it says so."""
    target = tmp_path / "target"
    wheel = sorted((REPO / "dist").glob("hotfix_checkpoint-*.whl"))[-1]  # scripts/test.sh built it: what PyPI has
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                          "--target", str(target), str(wheel)],
                         capture_output=True, text=True, timeout=300, env=clean_env())
    assert pip.returncode == 0, pip.stderr[-3000:]
    assert (target / "hotfix-checkpoint.pth").is_file() and (target / "hotfix" / "__init__.py").is_file()
    python = _bare_venv(tmp_path)
    (tmp_path / "fake" / "transformers").mkdir(parents=True)  # a trigger of the start-up hook
    (tmp_path / "fake" / "transformers" / "__init__.py").write_text("TRIGGERED = True\n")
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "sitecustomize.py").write_text("import hotfix.auto\n")

    def run(args, *paths):
        env = clean_env()
        env["PYTHONPATH"] = os.pathsep.join(str(tmp_path / p) for p in ("target", "fake", *paths))
        proc = subprocess.run([python, *args], capture_output=True, text=True, timeout=120, env=env,
                              cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout.splitlines()

    script = ["-c", "import sys, transformers; h = sys.modules.get('hotfix'); print(h is not None and h.registry.active)"]
    status = ["-m", "hotfix", "status", "--no-import"]
    assert run(script) == ["False"]  # never imports hotfix: unpatched
    header, hook = run(status)[:2]
    assert header.endswith("active")  # this process imported hotfix
    assert hook.startswith(f"start-up hook: NOT in effect: hotfix is in {target}, a folder on sys.path"), hook
    assert "a script that never imports hotfix runs UNPATCHED" in hook, hook
    assert "pip install hotfix-checkpoint" in hook and "`import hotfix.auto` in a sitecustomize.py" in hook, hook
    assert run(script, "custom") == ["True"]
    hook = run(status, "custom")[1]
    assert hook == (f"start-up hook: not installed as one, but {tmp_path / 'custom' / 'sitecustomize.py'} imports "
                    "hotfix at start-up: a script is patched when it imports transformers, unsloth or unsloth_zoo"), hook


UNREADABLE_FIX = {"foo_fix.py": """
    from hotfix import Mechanism, Patch

    class FooFix(Patch):
        name = "foo-bar-keyword"
        targets = ("foo_target",)
        mechanisms = (Mechanism("bar-keyword", {"wrapt": ">=4.x,<<5"}),)  # wrapt: installed wherever hotfix is

        def _apply(self, module):
            pass

    patch = FooFix()
"""}


def test_a_plugin_whose_specifier_does_not_parse_is_one_warning_and_status_says_why(tmp_path):
    """Issue 31 item 9, through the entry point: a malformed range was "not needed here" without a word."""
    plugins = plugin_dir(tmp_path, "foo-fix", UNREADABLE_FIX, "foo-bar-keyword = foo_fix:patch\n")
    proc = run_python(["-m", "hotfix", "status", "--no-import"], pythonpath=[plugins], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert hotfix_lines(proc.stderr) == [
        "hotfix: foo-bar-keyword: invalid declaration: mechanism 'bar-keyword': affected range of wrapt "
        "'>=4.x,<<5' is not a PEP 440 specifier set; not applied"], proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("  foo-bar-keyword:"))
    assert line == ("  foo-bar-keyword: NOT APPLIED: invalid declaration: mechanism 'bar-keyword': affected range "
                    "of wrapt '>=4.x,<<5' is not a PEP 440 specifier set  (from foo-fix)"), line


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_status_into_a_pipe_nobody_reads_ends_quietly(unbuffered):
    """Issue 31 item 10: ``hotfix status | head -1`` printed a BrokenPipeError traceback.  The reader is gone
    before the first byte here (its end is closed): block-buffered, the error came at the interpreter's last
    flush; unbuffered, at the first write.  Both: no traceback, exit status 0."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        env = clean_env({"PYTHONUNBUFFERED": unbuffered})
        proc = subprocess.run([sys.executable, "-m", "hotfix", "status", "--no-import"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, env=env, cwd=str(REPO / "tests"))
    finally:
        os.close(write_end)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
