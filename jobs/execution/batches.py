"""A thread that serves waiting callers in batches: what the completer and the claimer of
a Celery threads-pool worker share (jobs.execution.complete.Completer,
jobs.execution.claim.Claimer).

Each caller hands its request to the process's thread (`BatchThread.call`) and waits
for its own answer; the thread takes requests in windows (`windows`: the first, then
what comes within the window's seconds, at most `batch`), serves a window in as few
statements as its kind allows (`BatchThread._serve`) and answers each caller with its
value, or with the error that kept its part of the window from being served. The thread
has its own database connection (Django's are per thread) and starts on first use in a
process (after a fork: again).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.db import connection

R = TypeVar("R")  # what a caller asks
V = TypeVar("V")  # what it is answered


def windows(
    items: queue.SimpleQueue[Any],
    serve: Callable[[list[Any]], None],
    *,
    batch: int,
    seconds: float,
) -> None:
    """Hand the items of `items` (each a tuple whose first value is its monotonic arrival
    time) to `serve` in windows: `batch` of them, or what came within `seconds` of the
    window's first (0: what was already queued when the first was taken, so a lone item
    waits for nothing); until a None, after what came before it is served."""
    closed = False
    while not closed:
        item = items.get()
        if item is None:
            return
        window = [item]
        due = item[0] + seconds
        while len(window) < batch:
            try:
                # A timeout of 0 takes only what is queued already.
                more = items.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                break
            if more is None:
                closed = True
                break
            window.append(more)
        serve(window)


class Answer(Generic[V]):
    """What one caller waits for: its value, or the error that kept its request from
    being served."""

    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: V | None = None
        self.error: BaseException | None = None

    def give(self, value: V | None) -> None:
        self.value = value
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


# A request as the thread holds it: when it came, what it asks, who waits for it.
Pending = tuple[float, R, Answer[V]]


class BatchThread(Generic[R, V]):
    """A process's thread serving callers that each wait for their own answer (see the
    module docstring). A subclass says how a window is served (`_serve`, answering each
    of its callers: `answer_all`, `fail_all`) and how long a window stays open
    (`window_seconds`)."""

    name = "batches"

    def __init__(self, *, batch: int) -> None:
        self.batch = max(1, batch)
        self._requests: queue.SimpleQueue[Pending[R, V] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def window_seconds(self) -> float:
        """How long a window waits for more after its first request (0: not at all)."""
        return 0.0

    def call(self, request: R) -> V | None:
        """Hand `request` to the thread and wait for its answer; raises what its window
        raised."""
        self._start()
        answer: Answer[V] = Answer()
        self._requests.put((time.monotonic(), request, answer))
        while not answer.done.wait(timeout=1.0):
            thread = self._thread
            if thread is None or not thread.is_alive():  # never answered: nothing done
                raise RuntimeError(f"the {self.name} thread ended before answering")
        if answer.error is not None:
            raise answer.error
        return answer.value

    def queued(self) -> int:
        """How many requests wait for the thread (approximately: others may be adding)."""
        return self._requests.qsize()

    def stop(self, timeout: float | None = None) -> None:
        """End the thread once the requests before this call are served (a test's end)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._requests.put(None)
            thread.join(timeout=timeout)

    def _start(self) -> None:
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            windows(self._requests, self._serve, batch=self.batch, seconds=self.window_seconds())
        finally:
            connection.close()  # this thread's own

    def _serve(self, window: list[Pending[R, V]]) -> None:
        raise NotImplementedError


def answer_all(answers: Sequence[Answer[V]], values: Sequence[V | None]) -> None:
    """Answer each caller with its value, in order."""
    for answer, value in zip(answers, values, strict=True):
        answer.give(value)


def fail_all(answers: Sequence[Answer[Any]], error: BaseException) -> None:
    """Answer each caller with `error`: nothing of theirs was done. The thread's
    connection is closed (the database may be away: the next window connects again)."""
    connection.close()
    for answer in answers:
        answer.fail(error)
