"""The processes the tests start (workers, dispatchers, manage.py runs), forked from one
pre-imported interpreter instead of each spawned afresh.

A worker or dispatcher spawned by `python -m celery ...` or `python manage.py ...` spent
most of its first second importing Django's framework and the third-party libraries
(under coverage, which traces the imports too): a hundred of them a run on two cores.
The fork server is one process per test session that has imported those (nothing of
this project, no settings: `PRELOAD`, the same as tests/starter.py's) and forks a
child for each start. The child is what `python -m MODULE ARGS` or `python SCRIPT ARGS`
would be, from that point on: its own session (`setsid`, so a signal to its group
reaches its pool children and nothing else), `env` as its whole environment, `cwd`,
its output in the given files, unbuffered, stdin from /dev/null, signals at their
defaults, `sys.argv` as given; then the module or script runs as `__main__` and the
child ends with its exit status (an uncaught exception: the traceback and status 1).
Coverage follows it: the child keeps measuring with the server's tracer and saves its
own data file when it leaves (`patch = _exit`; [tool.coverage.run] says why not
`fork`). Forking saves 0.45 CPU s a start (`django.setup()` and the dispatcher's
imports: 0.72 s spawned, 0.27 s forked).

`ForkedProcess` is the part of `subprocess.Popen` that tests.processes uses: `pid`,
`poll()`, `wait(timeout)`, `send_signal(sig)`, `returncode`. The server reaps its
children and reports each exit status; a reader thread here hands it over.

Where the server cannot stand in for a real start (a prometheus_client multiprocess
directory, which that library reads when imported; an executable other than this
Python), `spawnable` says no and the caller spawns as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Imported by the fork server and tests/starter.py before any fork: third-party
# libraries and Django's framework modules that read no setting and no environment
# variable a test changes when imported (one that read a setting would fail here,
# settings unconfigured). Not prometheus_client: it picks its value class from
# PROMETHEUS_MULTIPROC_DIR when imported. Celery's command line and worker (half a
# second of each worker's start: click_repl and prompt_toolkit come with the former),
# requests and redis, which every worker and dispatcher imports.
PRELOAD = """
import django, django.conf, django.apps
import celery, celery.app, kombu, structlog, psycopg, dj_database_url
import celery.bin.celery, celery.apps.worker, celery.worker.worker, celery.concurrency.prefork
import redis, requests
import django.contrib.admin, django.core.serializers.json, django.db.backends.postgresql.base
import django.db.models, django.forms, django.http, django.template, django.urls
"""

# What both servers' children end with: `run()` as a script's body, and the exit status
# `python` would give it (an uncaught exception: its traceback on stderr and 1).
RUN_AS_MAIN = """
def run_as_main(run):
    import sys, traceback
    try:
        run()
    except SystemExit as exc:
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0
"""

SERVER = (
    PRELOAD
    + RUN_AS_MAIN
    + r"""
import io, json, os, runpy, selectors, signal, sys

answers = os.fdopen(os.dup(1), "w")
wakeup_r, wakeup_w = os.pipe()
os.set_blocking(wakeup_r, False)
os.set_blocking(wakeup_w, False)
signal.signal(signal.SIGCHLD, lambda *_: None)
signal.set_wakeup_fd(wakeup_w)
selector = selectors.DefaultSelector()
selector.register(0, selectors.EVENT_READ)
selector.register(wakeup_r, selectors.EVENT_READ)
pending = b""  # what stdin gave past its last whole line (read raw: select sees no buffer)


def child(request):
    os.setsid()
    signal.set_wakeup_fd(-1)
    answers.close()
    os.close(wakeup_r)
    os.close(wakeup_w)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"] or request["stdout"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, fd)
        os.close(out)
    # As PYTHONUNBUFFERED would make them: a test waits for a line in the log.
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), write_through=True, errors="backslashreplace")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.argv = list(request["argv"])
    if request["module"]:
        sys.path[0] = request["cwd"]
        run = lambda: runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(request["argv"][0]))
        run = lambda: runpy.run_path(request["argv"][0], run_name="__main__")
    status = run_as_main(run)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def reap():
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        answers.write(json.dumps(
            {"exited": pid, "returncode": os.waitstatus_to_exitcode(wait_status)}) + "\n")
        answers.flush()


parent = os.getppid()
while True:
    if os.getppid() != parent:  # the test process died without closing stdin: end too
        sys.exit(0)
    for key, _ in selector.select(timeout=5):
        if key.fileobj == 0:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the tests' session ended: children it left are its own to stop
                sys.exit(0)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    child(request)
                answers.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
                answers.flush()
        else:
            while True:
                try:
                    os.read(wakeup_r, 512)
                except BlockingIOError:
                    break
            reap()
"""
)


class ForkedProcess:
    """A child of the fork server, seen as `subprocess.Popen` shows a child."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._server.exited(self.pid).wait(timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = self._server.returncode(self.pid)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not a pid the system may have given another process
            os.kill(self.pid, sig)


class ForkServer:
    """The server (started on first use, one per test process) and its reader thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the tables below; never held across a pipe's I/O
        self._write = threading.Lock()  # one request at a time on the server's stdin
        self._proc: subprocess.Popen[str] | None = None
        self._next_id = 0
        self._started: dict[int, tuple[threading.Event, list[int]]] = {}
        self._exits: dict[int, threading.Event] = {}
        self._returncodes: dict[int, int] = {}

    def _ensure(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", SERVER],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            threading.Thread(target=self._read, args=(self._proc,), daemon=True).start()
        return self._proc

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            answer: dict[str, Any] = json.loads(line)
            with self._lock:
                if "exited" in answer:
                    self._returncodes[answer["exited"]] = answer["returncode"]
                    self._exits.setdefault(answer["exited"], threading.Event()).set()
                else:
                    event, pid = self._started[answer["id"]]
                    pid.append(answer["pid"])
                    event.set()

    def exited(self, pid: int) -> threading.Event:
        with self._lock:
            return self._exits.setdefault(pid, threading.Event())

    def returncode(self, pid: int) -> int | None:
        with self._lock:
            return self._returncodes.get(pid)

    def start(
        self,
        args: list[str],
        *,
        env: dict[str, str],
        cwd: Path,
        stdout: Path,
        stderr: Path | None = None,
    ) -> ForkedProcess:
        """Fork `args` (`[python, "-m", module, ...]` or `[python, script, ...]`, see
        `spawnable`) with `env`, its output appended to `stdout` (and `stderr`, or the
        same file)."""
        module = args[2] if args[1] == "-m" else None
        argv = [module, *args[3:]] if module else args[1:]
        with self._write:
            with self._lock:
                proc = self._ensure()
                self._next_id += 1
                request_id = self._next_id
                started: tuple[threading.Event, list[int]] = (threading.Event(), [])
                self._started[request_id] = started
            request = {
                "id": request_id,
                "argv": argv,
                "module": module,
                "env": env,
                "cwd": str(cwd),
                "stdout": str(stdout),
                "stderr": str(stderr) if stderr else None,
            }
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        if not started[0].wait(30):
            raise RuntimeError(f"the fork server did not start {args} (exit {proc.poll()})")
        with self._lock:
            del self._started[request_id]
        return ForkedProcess(self, started[1][0], args)

    def close(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()  # its loop ends; coverage saves its data at exit
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def spawnable(args: list[str], env: dict[str, str]) -> bool:
    """Whether the fork server can start `args` as a spawn would: this Python running a
    module or a script, and no environment variable a preloaded library reads at
    import. JOBOPS_TEST_SPAWN=1 (in the tests' environment) spawns every process."""
    if os.environ.get("JOBOPS_TEST_SPAWN") or env.get("PROMETHEUS_MULTIPROC_DIR"):
        return False
    if len(args) < 2 or args[0] != sys.executable or (args[1].startswith("-") and args[1] != "-m"):
        return False
    return args[1] != "-m" or len(args) >= 3


server = ForkServer()
