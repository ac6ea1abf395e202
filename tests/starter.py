"""Fresh interpreters for start-up checks, forked from one process instead of spawned.

The settings tests (tests/test_settings.py) start Django dozens of times, each in a new
process with its own environment, to see it start or refuse. Spawning a Python for
each (under coverage, importing Django) was most of that module's minutes. A `Starter`
is one process that has imported the `django` package, its framework modules and the
third-party libraries the settings import (tests.forkserver.PRELOAD, which the fork
server of the workers and dispatchers imports too), nothing of this project (no
settings, no app); each `run(code, env)` forks it, and the child, as a new interpreter would, takes
`env` as its whole environment, runs `code` with stdout and stderr of its own, and
ends with its exit status (an uncaught exception: its traceback on stderr and status
1, as `python -c` does). Coverage follows the child (it keeps the
starter's tracer and saves its own data file: `patch = _exit`).

    with Starter() as starter:
        result = starter.run("import django; django.setup()", env)
        result.returncode, result.stdout, result.stderr

Processes that are themselves the subject (`manage.py check`, a worker) are still
started as real processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import TracebackType
from typing import Any

from tests.forkserver import PRELOAD, ROOT, RUN_AS_MAIN

# The starter's own loop: one JSON request a line on stdin ({"code", "env"}), one JSON
# answer a line on stdout ({"returncode", "stdout", "stderr"}).
SERVER = (
    PRELOAD
    + RUN_AS_MAIN
    + r"""
import json, os, sys, tempfile

answers = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    request = json.loads(line)
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        os.environ.clear()
        os.environ.update(request["env"])
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        code = compile(request["code"], "<string>", "exec")
        status = run_as_main(lambda: exec(code, {"__name__": "__main__"}))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
        f.close()
    answers.write(json.dumps({
        "returncode": os.waitstatus_to_exitcode(wait_status),
        "stdout": texts[0],
        "stderr": texts[1],
    }) + "\n")
    answers.flush()
"""
)


class Starter:
    """The forking process (a context manager: started on enter, ended on exit)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Starter:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def run(self, code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """Run `code` in a forked child whose whole environment is `env`."""
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"code": code, "env": env}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the starter ended (exit status {self.proc.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return subprocess.CompletedProcess(
            ["<forked>", "-c", code], answer["returncode"], answer["stdout"], answer["stderr"]
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self.proc is not None
        if self.proc.stdin:
            self.proc.stdin.close()  # its loop ends; coverage saves its data at exit
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
