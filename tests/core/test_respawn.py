"""A worker group that exits is started again, and the Procfile runner keeps the rest up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.polling import wait_for
from tests.processes import ROOT

ENV = {**os.environ, "RESPAWN_MIN_BACKOFF": "0.1", "PYTHONUNBUFFERED": "1"}


def _respawn(*cmd: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "core.respawn", "--", *cmd],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_command_that_exits_is_started_again_until_told_to_stop():
    proc = _respawn(sys.executable, "-c", "print('run'); raise SystemExit(3)")
    lines = []
    deadline = time.monotonic() + 15
    while sum(line.strip() == "run" for line in lines) < 3 and time.monotonic() < deadline:
        lines.append(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert sum(line.strip() == "run" for line in lines) >= 3
    assert any("exited with 3" in line for line in lines)


def test_sigterm_reaches_the_command_and_ends_the_loop():
    child = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('term', flush=True), sys.exit(0)))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = _respawn(sys.executable, "-c", child)
    assert proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "term" in out and "starting it again" not in out


def test_a_command_whose_supervisor_is_killed_gets_sigterm_and_ends(tmp_path):
    """SIGKILL leaves nothing to forward: the kernel tells the command instead, so no
    worker lives on unsupervised, outside the runner."""
    pid_file, term_file = tmp_path / "pid", tmp_path / "term"
    child = (
        "import os, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(term_file)!r}, 'w').close(), "
        "sys.exit(0)))\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n"
    )
    proc = _respawn(sys.executable, "-c", child)
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=15)
    command = int(pid_file.read_text())
    proc.kill()
    proc.wait(timeout=10)
    wait_for(term_file.exists, timeout=10)  # it was told, and shut down its own way
    wait_for(lambda: not _running(command), timeout=10)


def _running(pid: int) -> bool:
    """Whether `pid` runs (an exited process its new parent has not reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_honcho_keeps_the_other_processes_when_a_respawned_one_exits(tmp_path):
    procfile = tmp_path / "Procfile"
    procfile.write_text(
        f"crashy: {sys.executable} -m core.respawn -- {sys.executable} -c 'raise SystemExit(1)'\n"
        f"steady: {sys.executable} -c 'import time; time.sleep(60)'\n"
    )
    honcho = Path(sys.executable).parent / "honcho"
    log = tmp_path / "honcho.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(honcho), "start", "-f", str(procfile), "-d", str(ROOT)],
            env=ENV,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: log.read_text().count("exited with 1") >= 2, timeout=15)
        assert proc.poll() is None, log.read_text()  # crashy went on restarting, steady too
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    assert "steady.1" in log.read_text()


def test_a_sigterm_that_comes_while_the_command_starts_still_reaches_it(monkeypatch, tmp_path):
    """On a loaded machine the command can be up before Popen returns it to the
    supervisor: a SIGTERM then must not be lost (the supervisor would wait on a command
    that never heard it). Here the signal comes inside Popen, every time."""
    import core.respawn as respawn

    term_file, ready_file = tmp_path / "term", tmp_path / "ready"
    child = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(term_file)!r}, 'w').close(), "
        "sys.exit(0)))\n"
        f"open({str(ready_file)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    real_popen = subprocess.Popen

    def popen_then_signalled(*args, **kwargs):
        started = real_popen(*args, **kwargs)
        wait_for(ready_file.exists, timeout=15)  # the command has set its handler
        os.kill(os.getpid(), signal.SIGTERM)  # runs `forward` before Popen returns
        return started

    monkeypatch.setattr(respawn.subprocess, "Popen", popen_then_signalled)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    alarm = signal.alarm(20)  # a lost signal would leave main() waiting 60 s
    try:
        assert respawn.main([sys.executable, "-c", child]) == 0
    finally:
        signal.alarm(alarm)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert term_file.exists()
