"""Races on purpose: run one function in many threads that start at the same instant."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connection


def run_in_threads(
    target: Callable[[int], object], count: int, *, timeout: float = 60
) -> list[BaseException]:
    """Call `target(index)` in `count` threads released together by a barrier; return
    what any of them raised. Each thread closes its own database connection. A thread
    still running after `timeout` seconds fails the test."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            target(index)
        except BaseException as exc:  # collected: the caller asserts on them
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    stuck = sum(thread.is_alive() for thread in threads)
    assert not stuck, f"{stuck} of {count} threads still running after {timeout}s"
    return errors
