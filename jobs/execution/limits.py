"""The soft time limit (docs/architecture.md: time limits), as the execution core sees it.

The core knows neither Celery nor any other delivery: its adapter says which exception a
handler meets at its type's soft limit (`SoftLimit.error`: both adapters give
`celery.exceptions.SoftTimeLimitExceeded`, so a handler catches the same class under
both executors) and whether the core raises it itself (`timer`: a run_worker child
process, through SIGALRM) or the delivery does (a Celery worker's pool).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SoftLimit:
    """The soft time limit of an adapter: the exception class a handler sees at its
    type's soft limit (the decision classifies it TIME_LIMIT), and whether the core arms
    a timer for it (only in a process's main thread: a signal interrupts nothing else)."""

    error: type[BaseException]
    timer: bool = False

    def install(self) -> None:
        """Make SIGALRM raise `error` in this process's main thread (a runner child's
        start): the timer `armed` sets then interrupts the handler."""
        error = self.error

        def _expired(_signum: int, _frame: Any) -> None:
            raise error("soft time limit exceeded")

        signal.signal(signal.SIGALRM, _expired)

    @contextlib.contextmanager
    def armed(self, seconds: float) -> Iterator[None]:
        """Raise `error` in the handler once `seconds` pass (when this limit has a timer
        and `seconds` is set); disarmed on the way out, whatever the way."""
        if not (self.timer and seconds):
            yield
            return
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
