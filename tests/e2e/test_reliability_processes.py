"""Reliability across processes and installs: spawned processes and DataLoader workers, pip uninstall
in a throwaway venv, what the .pth line touches at interpreter start (audit hook, strace).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from conftest import FINDER_ARMED, REPO, json_lines, run_python

SITE = Path(sysconfig.get_paths()["purelib"])


# ----------------------------------------------------------------------------
# 7. spawn-started processes and DataLoader workers
# ----------------------------------------------------------------------------
SPAWN_PROBE = """
    import os, sys

    def hotfix_modules():
        return sorted(m for m in sys.modules if "hotfix" in m)

    def probe(*_):
        before = hotfix_modules()
        armed = FINDER_ARMED
        import transformers.modeling_layers as ml
        return {"pid": os.getpid(), "before": before, "armed": armed, "after": hotfix_modules(),
                "patched": "_gradient_checkpointing_func" in ml.GradientCheckpointingLayer.__dict__}

    class ProbeDataset:
        def __len__(self):
            return 2
        def __getitem__(self, index):
            return probe()
""".replace("FINDER_ARMED", FINDER_ARMED)


def test_spawned_processes_and_dataloader_workers_are_patched(tmp_path):
    """2 DataLoader workers started by multiprocessing's ``spawn`` method
    (fresh interpreters, so only the .pth can patch them) start with only the
    inert boot module of hotfix loaded (nothing imported, nothing to pay at
    start-up; bench/ measures the interpreter start), and are patched as soon
    as they import transformers."""
    (tmp_path / "spawn_probe.py").write_text(textwrap.dedent(SPAWN_PROBE))
    proc = run_python(
        ["-c", textwrap.dedent(
            """
            import json, os
            import torch.utils.data
            import transformers.modeling_layers
            import spawn_probe
            loader = torch.utils.data.DataLoader(spawn_probe.ProbeDataset(), batch_size=None, num_workers=2,
                                                 multiprocessing_context="spawn")
            workers = list(loader)
            print(json.dumps({"parent": os.getpid(), "workers": workers}))
            """
        )],
        pythonpath=[tmp_path], timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json_lines(proc.stdout)[0]
    processes = seen["workers"]
    assert len({p["pid"] for p in processes} | {seen["parent"]}) == 3
    for p in processes:
        assert p["before"] == ["_hotfix_boot"] and p["armed"] is True, p
        assert "hotfix" in p["after"] and p["patched"] is True, p


# ----------------------------------------------------------------------------
# 8. pip uninstall leaves nothing behind (throwaway venv, no torch)
# ----------------------------------------------------------------------------
def test_pip_uninstall_leaves_nothing(tmp_path):
    """In a fresh venv (not --system-site-packages): install the wheel built
    from this checkout, see the .pth / .start / boot module / package, run an
    interpreter (the boot runs), uninstall, and nothing of hotfix is left in
    site-packages (also no __pycache__ entry of the boot module)."""
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    # Built from a copy: setuptools writes build/ and *.egg-info into the source tree.
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("hotfix", "patches"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=240, cwd=str(tmp_path),
    )
    assert build.returncode == 0, build.stderr
    wheel = next(wheels.glob("hotfix_checkpoint-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=240)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    before = {p.name for p in site.iterdir()} | {p.name for p in (site / "__pycache__").glob("*")}
    assert not any("hotfix" in name for name in before)

    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=240)
    installed = {p.name for p in site.iterdir()}
    assert {"hotfix", "_hotfix_boot.py", "hotfix-checkpoint.pth", "hotfix-checkpoint.start"} <= installed
    run = subprocess.run([python, "-c", "import sys; print(sorted(m for m in sys.modules if 'hotfix' in m))"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "['_hotfix_boot']", run.stderr

    subprocess.run(pip + ["uninstall", "-y", "-q", "hotfix-checkpoint"], check=True, timeout=240)
    after = {p.name for p in site.iterdir()} | {p.name for p in (site / "__pycache__").glob("*")}
    assert after == before, sorted(after ^ before)
    run = subprocess.run([python, "-c", "import sys; print(sorted(m for m in sys.modules if 'hotfix' in m))"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "[]" and run.stderr == ""


# ----------------------------------------------------------------------------
# 9. What the .pth line does at every interpreter start
# ----------------------------------------------------------------------------
AUDIT_PROBE = """
    import os, sys, json   # os is loaded by site before any .pth line runs
    site_dir, pth = sys.argv[1], sys.argv[2]
    line = [l for l in open(pth).read().splitlines() if l.startswith("import")][0]
    sys.path.append(site_dir)
    WATCH = ("open", "socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
             "os.putenv", "os.unsetenv", "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod",
             "os.truncate", "os.symlink", "os.link", "shutil.", "ctypes.", "urllib.", "http.", "import")
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    events = []

    def hook(event, args):
        if event.startswith(WATCH):
            entry = [event, repr(args)[:300]]
            if event == "open":  # (path, mode, flags): io.open gives a mode, os.open flags
                path, mode, flags = args
                writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS)
                entry = [event, str(path), writes]
            events.append(entry)

    sys.addaudithook(hook)
    sitedir = site_dir
    exec(line)                              # exactly what site.addpackage does with the line
    ours = list(events)
    events.clear()
    import site
    site.main()                             # the whole start-up, every .pth of the venv
    print(json.dumps({"line": line, "ours": ours, "site": events}))
"""


def test_pth_line_touches_only_its_own_module():
    """Run the .pth line under ``sys.addaudithook`` (installed before site, via
    ``python -S``): the only events are read-only opens of ``_hotfix_boot``'s
    own file (loaded by location) and imports of already-loaded built-ins; no write, socket, subprocess, exec or
    environment change; the whole ``site.main()`` of the venv opens nothing
    for writing either."""
    pth = SITE / "hotfix-checkpoint.pth"
    proc = run_python(["-S", "-c", textwrap.dedent(AUDIT_PROBE), str(SITE), str(pth)], timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json_lines(proc.stdout)[0]
    # The boot module is looked up in the folder of the .pth alone (site's `sitedir`), never by a
    # name on sys.path that a user's own _hotfix_boot.py could shadow.
    assert "e.PathFinder.find_spec('_hotfix_boot', [sitedir])" in seen["line"], seen["line"]
    assert seen["line"].endswith(".boot(None)"), seen["line"]
    ours = seen["ours"]
    imports = [entry[1] for entry in ours if entry[0] == "import"]
    assert all(args.startswith(("('_frozen_importlib", "('sys'")) for args in imports), ours
    opens = [entry for entry in ours if entry[0] == "open"]
    assert opens and all("_hotfix_boot" in path and not writes for _, path, writes in opens), ours
    assert {entry[0] for entry in ours} <= {"import", "open", "os.listdir", "os.scandir"}, ours
    for entry in seen["site"]:
        assert entry[0] in ("import", "open", "os.listdir", "os.scandir"), entry
        assert not (entry[0] == "open" and entry[2]), entry


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_interpreter_start_under_strace():
    """``python -c pass`` in the test venv (hotfix installed, boot armed) under
    strace: one execve (itself), no socket or connect, no write(), and every
    openat read-only."""
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=openat,open,creat,connect,socket,execve,write,sendto,unlink,rename,mkdir",
         sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60, cwd=str(REPO / "tests" / "_scratch"),
        env={k: v for k, v in os.environ.items() if not k.startswith(("HOTFIX_", "PYTHON"))},
    )
    assert proc.returncode == 0, proc.stderr
    calls = [l for l in proc.stderr.splitlines() if re.match(r"(\[pid\s+\d+\] )?\w+\(", l)]
    assert any("_hotfix_boot" in l for l in calls), "the boot module was not loaded"
    assert len([l for l in calls if "execve(" in l]) == 1, calls
    bad = [l for l in calls if re.search(r"\b(connect|socket|write|sendto|unlink|rename|mkdir|creat)\(", l)
           or ("openat(" in l and re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND", l))]
    assert bad == [], bad
