"""Fresh interpreters with and without hotfix, and the JSON lines they print.

A run "without hotfix" must really be unpatched, so it happens in a new
interpreter started with ``HOTFIX_DISABLE=1`` (which stops both ``import
hotfix`` and the ``.pth`` auto-activation).  ``hotfix doctor``,
``check-model --compare-hotfix``, the tests, the benchmarks and the sweep
all start their children here, with one rule for the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, Iterable, List, Mapping, Optional, Sequence


from hotfix.config import DISABLE_VAR


def child_env(
    hotfix: bool = True,
    *,
    base: Optional[Mapping[str, str]] = None,
    keep_hotfix_settings: bool = True,
    pythonpath: Optional[Iterable[object]] = None,
    extra: Optional[Mapping[str, str]] = None,
) -> Dict[str, str]:
    """The environment of a child: ``base`` (default ``os.environ``) with hotfix on or off.

    ``keep_hotfix_settings=False`` also drops every other ``HOTFIX_*`` setting
    (tests and benchmarks start from a clean slate).  ``pythonpath`` replaces
    PYTHONPATH (an empty list removes it); None keeps the parent's.
    """
    env = dict(os.environ if base is None else base)
    for key in [k for k in env if k == DISABLE_VAR or (not keep_hotfix_settings and k.startswith("HOTFIX_"))]:
        del env[key]
    if pythonpath is not None:
        env.pop("PYTHONPATH", None)
        paths = [str(p) for p in pythonpath]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
    if not hotfix:
        env[DISABLE_VAR] = "1"
    env.update(extra or {})
    return env


def json_lines(text: str) -> List[dict]:
    """Every line of ``text`` that is a JSON object, parsed; other lines are ignored."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The last line the child wrote (stderr first): what to show when it printed no result."""
    tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:]
    return tail[0] if tail else f"no output (exit status {proc.returncode})"


def run_python(
    args: Sequence[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[object] = None,
    timeout: Optional[float] = None,
    python: Optional[str] = None,
) -> subprocess.CompletedProcess:
    """``python ARGS`` in a fresh interpreter (this one's by default), output captured as text."""
    return subprocess.run(
        [python or sys.executable, *args],
        env=dict(env) if env is not None else child_env(),
        cwd=None if cwd is None else str(cwd),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: what a child of the user's command runs first: this interpreter's sys.path (argv[1], JSON), then the module
#: argv[2] as ``python -m`` would, with the rest of argv
WITH_PATH = ("import json, runpy, sys; sys.path[:] = json.loads(sys.argv[1]); module = sys.argv[2]; "
             "sys.argv[:] = [module, *sys.argv[3:]]; runpy.run_module(module, run_name='__main__', alter_sys=True)")


def module_with_this_path(module: str, *args: str) -> List[str]:
    """The arguments that run ``python -m MODULE ARGS`` in a child that imports from exactly this interpreter's
    ``sys.path`` (relative entries, '' included, made absolute from here): a ``PYTHONPATH=tf`` of the user's,
    the folder a script ran from, ``PYTHONSAFEPATH`` hold there as here, whatever the child's working folder
    (``hotfix doctor``'s is the temporary folder)."""
    path = [os.path.abspath(entry) if isinstance(entry, str) else entry for entry in sys.path]
    return ["-c", WITH_PATH, json.dumps(path), module, *args]


def check_model_child(argv: Sequence[str], disabled: bool) -> dict:
    """``hotfix check-model ARGV --json`` in a fresh interpreter with hotfix off (``disabled``) or on and this
    interpreter's ``sys.path``: its report, with its exit status (``check-model --compare-hotfix``)."""
    proc = run_python(module_with_this_path("hotfix", "check-model", *argv, "--json"),
                      env=child_env(hotfix=not disabled))
    found = json_lines(proc.stdout)
    if found:
        return dict(found[-1], exit_status=proc.returncode)
    return {"exit_status": proc.returncode, "safe": False, "verdict": f"child failed: {last_line(proc)}", "modes": []}
