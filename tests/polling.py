"""Waiting on real processes: poll a condition until a deadline, then fail loudly.

Workers, dispatchers, the broker's dead-lettering and servers starting up all act in
their own time. Tests never sleep for "long enough": they poll the condition they need
and, when the deadline passes, fail with an AssertionError that names what they waited
for and the last value seen.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def describe(predicate: Callable[..., object]) -> str:
    """The predicate's source line (a lambda reads as what it waits for), else its repr."""
    try:
        return " ".join(inspect.getsource(predicate).split())
    except (OSError, TypeError):
        return repr(predicate)


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float = 20,
    interval: float = 0.05,
    what: str | None = None,
) -> T:
    """Poll until `predicate()` is truthy and return that value.

    After `timeout` seconds raise AssertionError naming `what` (by default the
    predicate's source) and the last value it returned.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"waited {timeout}s for {what or describe(predicate)}; last value {value!r}"
            )
        time.sleep(interval)
