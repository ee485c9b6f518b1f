"""Children forked from a long-lived interpreter that has imported their heavy modules already.

Most of a test's child is interpreter start and ``import torch, transformers`` (3 - 4 s of a 5 - 7 s child on the
2-core VM).  A *server* is one interpreter of one environment (interpreter, flags, environment variables, hence the
releases on PYTHONPATH and hotfix on or off) that imports the modules a caller names (``warm``) once; each request
then runs in a process forked from it: as fresh as a new interpreter in everything the warm imports do not decide
(its own ``sys.argv``, ``__main__``, working folder, output files; its own copy of every module's state), and each
child's output begins with what the warm imports printed, as a fresh interpreter's would.

Only where the caller says so (``WarmInterpreters.run(..., warm=...)``): a child whose subject is what happens at
interpreter start or in what order modules load (start-up hook, activation order, CLI, packaging) must start fresh,
and so must one that puts a release on ``sys.path`` itself before importing it.  Supported command lines:
``[-P] -c CODE ARGS``, ``[-P] -m MODULE ARGS`` and ``[-P] SCRIPT ARGS``; any other (``-X``, ``-S``, ...) answers
None, and the caller starts a fresh interpreter.  The server loads this file by path, under a name the child drops
from ``sys.modules``; stdlib only (a side torch's venv runs it too).  conftest's ``run_python(warm=...)`` uses it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

#: how many servers one pool keeps (each holds torch and transformers: ~0.5 GB); the least recently used goes first
KEEP = 6
#: environment variables nothing reads at start-up or in a warm import, so children differing in them share a
#: server (each child gets its own environment whole): the port of a one-rank process group
#: (``rank_results.command``), and the test pytest is running (it sets this one for each test and phase)
PER_CHILD = frozenset({"MASTER_PORT", "PYTEST_CURRENT_TEST"})
#: what the server module is called in its own interpreter (removed from the child's ``sys.modules``)
SERVER_NAME = "_hotfix_warm_interpreter"

_BOOT = ("import importlib.util as u, sys; s = u.spec_from_file_location({name!r}, {path!r}); "
         "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m); "
         "m.serve({warm!r}, {safe_path!r})")


def parse(args: Sequence[str]) -> Optional[Tuple[bool, str, str, List[str]]]:
    """``(safe_path, kind, target, rest)`` of a supported command line (kind ``-c``, ``-m`` or ``script``), or None."""
    args = list(args)
    safe_path = bool(args) and args[0] == "-P"
    if safe_path:
        args = args[1:]
    if len(args) >= 2 and args[0] in ("-c", "-m"):
        return safe_path, args[0], args[1], args[2:]
    if args and not args[0].startswith("-"):
        return safe_path, "script", args[0], args[1:]
    return None


# ---- the server side (runs in the child's interpreter) ------------------------------------------------------------

def _capture(warm: Sequence[str]) -> Tuple[bytes, bytes, Optional[str]]:
    """Import ``warm`` with fd 1 and 2 in files: (what they wrote to each, the error that stopped an import)."""
    import tempfile

    saved = os.dup(1), os.dup(2)
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(files[0].fileno(), 1), os.dup2(files[1].fileno(), 2)
    error = None
    try:
        for module in warm:
            __import__(module)
    except BaseException as exc:  # the server says so and stops: the caller starts a fresh interpreter
        error = f"{type(exc).__name__}: {exc}"
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        os.close(saved[0]), os.close(saved[1])
    written = []
    for handle in files:
        handle.seek(0)
        written.append(handle.read())
        handle.close()
    return written[0], written[1], error


def _exit_status(code: object) -> int:
    """The exit status of ``SystemExit(code)``, as the interpreter gives it (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(request: dict, prefix: Tuple[bytes, bytes], reply_fd: int) -> None:
    """In the forked process: become ``python ARGS`` run in ``cwd``, output in the request's files; never returns."""
    status = 1
    try:
        os.setpgid(0, 0)  # its own group: a timeout stops what it started too
        os.close(reply_fd)
        for fd, path, written in ((1, request["stdout"], prefix[0]), (2, request["stderr"], prefix[1])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(target, written)
            os.dup2(target, fd)
            os.close(target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = open(0, closefd=False)  # not the server's reader, which may hold requests read ahead
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.modules.pop(SERVER_NAME, None)
        # What a fresh interpreter draws for itself: multiprocessing's authkey names a job (hotfix's repair notices
        # are said once per job: hotfix.notice), so each child draws its own, as a new interpreter would.
        # (``random`` reseeds itself in a forked child.)
        process = sys.modules.get("multiprocessing.process")
        if process is not None:
            process.current_process().authkey = os.urandom(32)
        status = _run(request["args"])
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _run(args: Sequence[str]) -> int:
    """Run the command line as the interpreter would, after start-up: its exit status (its exit functions run)."""
    import atexit
    import runpy
    import types

    safe_path, kind, target, rest = parse(args)
    try:
        if kind == "-c":
            sys.argv[:] = ["-c", *rest]
            if not safe_path:
                sys.path.insert(0, "")
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        elif kind == "-m":
            sys.argv[:] = [target, *rest]  # runpy puts the module's file there
            if not safe_path:
                sys.path.insert(0, os.getcwd())
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv[:] = [target, *rest]
            if not safe_path:
                sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:  # printed as the interpreter prints it: without this function's frame
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        status = 1
    # what the interpreter does at its end: wait for non-daemon threads, then the exit functions
    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    return status


def serve(warm: Sequence[str], safe_path: bool) -> None:
    """The server's loop: one JSON request a line on stdin, answered on stdout with the child's pid, then its status."""
    reply_fd = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # nothing the server's modules print reaches the protocol
    os.close(null)
    if not safe_path and sys.path and sys.path[0] == "":
        del sys.path[0]  # the bootstrap's -c put it there; a request's -c puts it back
    out, err, error = _capture(warm)
    reply = os.fdopen(reply_fd, "w", buffering=1)
    reply.write(json.dumps({"ready": error is None, "error": error}) + "\n")
    if error is not None:
        return
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, (out, err), reply_fd)
        reply.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        reply.write(json.dumps({"rc": code}) + "\n")


# ---- the caller's side ---------------------------------------------------------------------------------------------

class _Server:
    """One server process and the lock of its one request at a time."""

    def __init__(self, python: str, safe_path: bool, env: Mapping[str, str], warm: Tuple[str, ...], cwd: str) -> None:
        boot = _BOOT.format(name=SERVER_NAME, path=os.path.abspath(__file__), warm=list(warm), safe_path=safe_path)
        self.lock = threading.Lock()
        self.process = subprocess.Popen([python, *(["-P"] if safe_path else []), "-c", boot], env=dict(env), cwd=cwd,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, bufsize=1)
        self.ready: Optional[bool] = None
        self._unread = b""  # what was read of the server's answers and not yet taken (read from the pipe itself)

    def answer(self, timeout: Optional[float]) -> Optional[dict]:
        """The server's next line; None where it ended.  ``TimeoutError`` where it said nothing within ``timeout``
        seconds.  Read by ``os.read``: a buffered reader could hold the next line while ``select`` waits for more."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while b"\n" not in self._unread:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._unread += chunk
        line, self._unread = self._unread.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        try:
            self.process.stdin.close()  # the server's loop ends at the end of its input
        except OSError:  # it ended already
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


class WarmInterpreters:
    """The servers of one caller (a pytest worker), by environment; at most :data:`KEEP` at once."""

    def __init__(self, scratch: str, keep: int = KEEP) -> None:
        self.scratch, self.keep = scratch, keep
        self._servers: Dict[tuple, _Server] = {}
        self._lock = threading.Lock()

    def run(self, args: Sequence[str], *, env: Mapping[str, str], cwd: str, timeout: Optional[float], python: str,
            warm: Sequence[str]) -> Optional[subprocess.CompletedProcess]:
        """``python ARGS`` forked from a server that imported ``warm``, or None where it cannot be (a command line of
        another form, a server that failed to start or is busy): the caller then starts a fresh interpreter."""
        parsed = parse(args)
        if parsed is None or not warm:
            return None
        server = self._server(python, parsed[0], env, tuple(warm))
        if server is None or not server.lock.acquire(blocking=False):
            return None
        try:
            return self._request(server, list(args), env, cwd, timeout, python)
        finally:
            server.lock.release()

    def _server(self, python: str, safe_path: bool, env: Mapping[str, str], warm: Tuple[str, ...]) -> Optional[_Server]:
        key = (python, safe_path, tuple(sorted((k, v) for k, v in env.items() if k not in PER_CHILD)), warm)
        with self._lock:
            server = self._servers.pop(key, None)
            if server is not None and server.process.poll() is not None:  # it ended (killed): a new one
                server.close()
                server = None
            if server is None:
                for old in list(self._servers):  # the least recently used first, never one serving a child now
                    if len(self._servers) < self.keep:
                        break
                    if self._servers[old].lock.acquire(blocking=False):
                        self._servers.pop(old).close()
                server = _Server(python, safe_path, env, warm, self.scratch)
            self._servers[key] = server  # last: the most recently used
        if server.ready is None:
            with server.lock:
                if server.ready is None:
                    try:
                        first = server.answer(600)
                    except TimeoutError:
                        first = None
                    server.ready = bool(first and first.get("ready"))
        if not server.ready:
            return None
        return server

    def _request(self, server: _Server, args: List[str], env: Mapping[str, str], cwd: str, timeout: Optional[float],
                 python: str) -> Optional[subprocess.CompletedProcess]:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="warm-", dir=self.scratch) as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            try:
                server.process.stdin.write(json.dumps({"args": args, "env": dict(env), "cwd": str(cwd), "stdout": out,
                                                       "stderr": err}) + "\n")
                server.process.stdin.flush()
            except OSError:
                return None
            try:
                started = server.answer(30)
            except TimeoutError:
                started = None
            if not started or "pid" not in started:
                return None
            try:
                ended = server.answer(timeout)
            except TimeoutError:
                try:
                    os.killpg(started["pid"], signal.SIGKILL)
                except OSError:
                    pass
                try:
                    server.answer(30)  # its status, once it is gone
                except TimeoutError:
                    pass
                raise subprocess.TimeoutExpired([python, *args], timeout, output=_read(out), stderr=_read(err))
            if ended is None:  # the server ended under the child: the caller runs it fresh
                return None
            return subprocess.CompletedProcess([python, *args], ended["rc"], _read(out), _read(err))

    def close(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""
