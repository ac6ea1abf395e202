"""The fork server (tests/forkserver.py): a forked child is what a spawned process would
be, seen from the test: its arguments, its environment alone, its own process group,
its output unbuffered in its file, its exit status or the signal that ended it."""

from __future__ import annotations

import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.forkserver import ForkServer, spawnable
from tests.polling import wait_for

SCRIPT = """
import os, sys, time
print("argv", sys.argv[1:])
print("env", os.environ.get("FORKED_PROBE"), "HOME" in os.environ)
print("group", os.getpgid(0) == os.getpid())
print("main", __name__)
if sys.argv[1] == "wait":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_script_has_its_argv_env_group_and_exit_status(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    server = ForkServer()
    try:
        out = tmp_path / "out.log"
        child = server.start(
            [sys.executable, str(script), "3"],
            env={"FORKED_PROBE": "yes"},
            cwd=tmp_path,
            stdout=out,
        )
        assert child.wait(20) == 3
        assert out.read_text().splitlines() == [
            "argv ['3']",
            "env yes False",
            "group True",
            "main __main__",
        ]

        waiting = tmp_path / "wait.log"
        waiting.touch()
        child = server.start(
            [sys.executable, str(script), "wait"], env={}, cwd=tmp_path, stdout=waiting
        )
        # Unbuffered: the lines are there while the child still runs.
        wait_for(lambda: "main __main__" in waiting.read_text(), timeout=20, what="its lines")
        assert child.poll() is None
        child.send_signal(signal.SIGTERM)
        assert child.wait(20) == -signal.SIGTERM
    finally:
        server.close()


def test_a_module_runs_as_python_m_would(tmp_path: Path) -> None:
    server = ForkServer()
    try:
        out = tmp_path / "out.log"
        started = time.monotonic()
        child = server.start(
            [sys.executable, "-m", "platform", "--terse"], env={}, cwd=tmp_path, stdout=out
        )
        assert child.wait(20) == 0, out.read_text()
        assert out.read_text().startswith("Linux-")
        assert time.monotonic() - started < 20
    finally:
        server.close()


def test_starts_asked_for_at_once_from_many_threads_each_start(tmp_path: Path) -> None:
    """Requests that reach the server together (tests.processes.together starts a worker
    and a dispatcher side by side) are each served, none left waiting for the next."""
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    server = ForkServer()

    def start(n: int) -> int:
        child = server.start(
            [sys.executable, str(script), str(n)], env={}, cwd=tmp_path, stdout=tmp_path / f"{n}"
        )
        return child.wait(20)

    try:
        for _ in range(3):
            with ThreadPoolExecutor(max_workers=12) as pool:
                assert list(pool.map(start, range(12))) == list(range(12))
    finally:
        server.close()


def test_what_the_fork_server_cannot_stand_in_for_is_spawned() -> None:
    assert spawnable([sys.executable, "manage.py", "check"], {})
    assert spawnable([sys.executable, "-m", "celery", "worker"], {})
    assert not spawnable([sys.executable, "-m", "celery"], {"PROMETHEUS_MULTIPROC_DIR": "/tmp"})
    assert not spawnable(["/usr/bin/env", "python"], {})
    assert not spawnable([sys.executable, "-c", "print(1)"], {})
    assert not spawnable([sys.executable, "-m"], {})
