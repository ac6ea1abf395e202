"""`python -m core.respawn -- CMD...`: run CMD, and run it again whenever it exits.

The Procfile runner (honcho) stops every process as soon as one exits, so a worker
group that died (a crash, an OOM kill) took web, the dispatcher and the other worker
group down with it. Each worker group runs under this instead: its exit is logged and
it starts again after a backoff (1 s, doubling to 30 s; back to 1 s once a run lasted a
minute). SIGTERM/SIGINT are passed to the command, and then this exits with it.

If this process is killed outright (SIGKILL: nothing to forward), the command gets
SIGTERM from the kernel (PR_SET_PDEATHSIG) and shuts down warmly. Without it the
command lived on unsupervised, outside the runner: a worker that kept taking jobs
after `make run` was stopped, with whatever code it had started with.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from types import FrameType

MIN_BACKOFF = float(os.environ.get("RESPAWN_MIN_BACKOFF", "1"))
MAX_BACKOFF = 30.0
HEALTHY_RUN_SECONDS = 60.0


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _term_when_parent_dies(parent: int) -> None:
    """In the child, before exec: SIGTERM once `parent` is gone (Linux; elsewhere the
    command is simply not tied to this process)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m core.respawn -- CMD [ARGS...]", file=sys.stderr)
        return 2
    stopping = False
    received: int | None = None
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping, received
        stopping, received = True, signum
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    backoff = MIN_BACKOFF
    parent = os.getpid()
    while True:
        started = time.monotonic()
        child = subprocess.Popen(argv, preexec_fn=functools.partial(_term_when_parent_dies, parent))
        if received is not None and child.poll() is None:
            # The signal came while Popen had not yet returned the child (it may already
            # run, on a loaded machine): `forward` had none to pass it to.
            child.send_signal(received)
        code = child.wait()
        if stopping:
            return code
        ran = time.monotonic() - started
        backoff = MIN_BACKOFF if ran >= HEALTHY_RUN_SECONDS else backoff
        print(
            f"respawn: {argv[0]} exited with {code} after {ran:.1f}s; "
            f"starting it again in {backoff:g}s",
            file=sys.stderr,
            flush=True,
        )
        deadline = time.monotonic() + backoff
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        if stopping:
            return code
        backoff = min(MAX_BACKOFF, backoff * 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
