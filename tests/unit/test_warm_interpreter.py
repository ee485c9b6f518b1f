"""tests/support/warm_interpreter.py: a child forked from a warm server runs as a fresh interpreter would (issue 52,
part 2: one long-lived child per release environment).  Stdlib-only warm modules here: what is proven is the
protocol and the child's freshness, not torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from warm_interpreter import WarmInterpreters

#: what a child reports of itself: the same program run fresh and forked must print the same
SELF_REPORT = textwrap.dedent("""
    import json, os, sys
    import warm_probe
    print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(),
                      "imported_here": warm_probe.PID == os.getpid(), "touched": getattr(warm_probe, "touched", False),
                      "main": sys.modules["__main__"].__dict__.get("MARK"),
                      "server": "_hotfix_warm_interpreter" in sys.modules}))
    warm_probe.touched = True
    MARK = 1
    sys.exit(int(sys.argv[-1]))
""")


@pytest.fixture
def warm_env(tmp_path):
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "warm_probe.py").write_text(textwrap.dedent("""
        import os, sys
        PID = os.getpid()
        print("warm_probe says hello")
        print("warm_probe warns", file=sys.stderr)
    """))
    (folder / "broken_probe.py").write_text("raise ImportError('not here')\n")
    (folder / "as_module.py").write_text("import sys; print(sys.argv[1:], __name__)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(folder)}
    pool = WarmInterpreters(str(tmp_path))
    yield pool, env, tmp_path
    pool.close()


def _fresh(args, env, cwd):
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_a_forked_child_runs_as_a_fresh_interpreter_would(warm_env):
    pool, env, cwd = warm_env
    import json

    for args in (["-c", SELF_REPORT, "x", "7"], ["-P", "-c", SELF_REPORT, "0"]):
        fresh = _fresh(args, env, cwd)
        first = pool.run(args, env=env, cwd=str(cwd), timeout=60, python=sys.executable, warm=("warm_probe",))
        second = pool.run(args, env=env, cwd=str(cwd), timeout=60, python=sys.executable, warm=("warm_probe",))
        assert first is not None and second is not None
        for forked in (first, second):
            assert forked.returncode == fresh.returncode == int(args[-1])
            # the warm import's output leads the child's, as in a fresh interpreter that imports it first
            assert forked.stdout.splitlines()[0] == fresh.stdout.splitlines()[0] == "warm_probe says hello"
            assert forked.stderr == fresh.stderr == "warm_probe warns\n"
            mine, theirs = json.loads(forked.stdout.splitlines()[1]), json.loads(fresh.stdout.splitlines()[1])
            # imported in the server, not in the child: the warm import was reused ...
            assert theirs.pop("imported_here") is True and mine.pop("imported_here") is False
            # ... and everything else is the fresh interpreter's: argv, sys.path[0], __main__, the folder; no state
            # left by the child before (its attribute on the warm module, its __main__), no server module in sight
            assert mine == theirs, (mine, theirs)
            assert mine["touched"] is False and mine["main"] is None and mine["server"] is False


def test_modules_scripts_errors_and_timeouts(warm_env, tmp_path):
    pool, env, cwd = warm_env
    run = lambda args, timeout=60: pool.run(args, env=env, cwd=str(cwd), timeout=timeout,  # noqa: E731
                                            python=sys.executable, warm=("warm_probe",))
    module = run(["-m", "as_module", "a", "b"])
    assert module.returncode == 0 and module.stdout.splitlines()[1] == "['a', 'b'] __main__"
    script = tmp_path / "script.py"
    script.write_text("import sys; print(sys.argv)\n")
    assert run([str(script), "z"]).stdout.splitlines()[1] == str([str(script), "z"])
    failed = run(["-c", "raise ValueError('boom')"])
    assert failed.returncode == 1
    # the traceback as the interpreter prints it: the child's frames only, none of the server's
    assert failed.stderr.startswith("warm_probe warns\nTraceback") and "ValueError: boom" in failed.stderr
    assert "warm_interpreter" not in failed.stderr
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        run(["-c", "import time; print('started', flush=True); time.sleep(60)"], timeout=2)
    assert "started" in stopped.value.output
    assert run(["-c", "print('after')"]).stdout.splitlines()[1] == "after"  # the server serves on


def test_what_it_cannot_fork_is_left_to_a_fresh_interpreter(warm_env):
    pool, env, cwd = warm_env
    ask = lambda args, warm: pool.run(args, env=env, cwd=str(cwd), timeout=60,  # noqa: E731
                                      python=sys.executable, warm=warm)
    assert ask(["-X", "dev", "-c", "pass"], ("warm_probe",)) is None  # a flag the server would not share
    assert ask(["-c", "pass"], ()) is None  # nothing named warm
    assert ask(["-c", "pass"], ("broken_probe",)) is None  # a warm import that fails


def test_children_differing_in_a_late_read_variable_share_a_server_and_see_their_own(warm_env):
    pool, env, cwd = warm_env
    code = "import os, warm_probe; print(os.environ['MASTER_PORT'], warm_probe.PID)"
    seen = [pool.run(["-c", code], env=dict(env, MASTER_PORT=port), cwd=str(cwd), timeout=60, python=sys.executable,
                     warm=("warm_probe",)).stdout.splitlines()[1].split() for port in ("1111", "2222")]
    assert [port for port, _ in seen] == ["1111", "2222"]
    assert seen[0][1] == seen[1][1]  # one server imported warm_probe for both


def test_each_child_draws_what_a_fresh_interpreter_draws(warm_env):
    """multiprocessing's authkey names a job: hotfix says each repair notice once per job (hotfix.notice), so
    children of one server sharing the server's key would silence each other's notices."""
    pool, env, cwd = warm_env
    code = ("import random; from multiprocessing import current_process; "
            "print(current_process().authkey.hex(), random.random())")
    drawn = [pool.run(["-c", code], env=env, cwd=str(cwd), timeout=60, python=sys.executable,
                      warm=("multiprocessing", "random")).stdout.split() for _ in range(2)]
    assert drawn[0][0] != drawn[1][0] and drawn[0][1] != drawn[1][1]


def test_a_server_serving_a_child_is_never_closed_to_make_room(warm_env):
    """At most ``keep`` servers: the least recently used idle one goes, never one whose child runs (that child would
    read as timed out)."""
    import threading

    _, env, cwd = warm_env
    pool = WarmInterpreters(str(cwd), keep=1)
    try:
        done = {}
        slow = threading.Thread(target=lambda: done.update(slow=pool.run(
            ["-c", "import time; time.sleep(3); print('slept')"], env=env, cwd=str(cwd), timeout=60,
            python=sys.executable, warm=("warm_probe",))))
        slow.start()
        time.sleep(1.5)  # the slow child runs
        other = pool.run(["-c", "print('other')"], env=dict(env, OTHER="1"), cwd=str(cwd), timeout=60,
                         python=sys.executable, warm=("warm_probe",))
        assert slow.is_alive()  # the other child did not wait for the slow one's server to be closed
        slow.join()
        assert other.stdout.splitlines()[1] == "other"
        assert done["slow"].returncode == 0 and done["slow"].stdout.splitlines()[1] == "slept"
    finally:
        pool.close()


def test_two_answers_in_one_read_are_both_taken():
    """The server writes a child's pid, then its status: a fast child's two lines can arrive in one read.  Each is
    answered at once (a buffered reader held the second while select waited for more: a spurious 60 s timeout in
    the rehearsal of 0895748)."""
    import os
    import types

    from warm_interpreter import _Server

    read_end, write_end = os.pipe()
    server = object.__new__(_Server)
    server.process = types.SimpleNamespace(stdout=types.SimpleNamespace(fileno=lambda: read_end))
    server._unread = b""
    try:
        os.write(write_end, b'{"pid": 1}\n{"rc": 0}\n')
        assert server.answer(1) == {"pid": 1}
        assert server.answer(1) == {"rc": 0}
        with pytest.raises(TimeoutError):
            server.answer(0.2)
        os.close(write_end)
        assert server.answer(1) is None  # the server ended
    finally:
        os.close(read_end)
