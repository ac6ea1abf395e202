"""Bounds on JSON values that come from outside: request bodies, job params, messages, results.

PostgreSQL's jsonb refuses NUL characters and unpaired surrogates, Python's float
admits NaN and Infinity that JSON does not, and deep nesting exhausts Python's
recursion (json, pickle, deepcopy) long before it exhausts memory. Every value that
crosses a trust boundary is checked here before it is stored or passed on; the walk
uses an explicit stack, so the check itself cannot overflow.

JSON text from outside is read with `json_loads`: Python refuses to turn a digit string
longer than its limit into an int, and says so by naming `sys.set_int_max_str_digits()`,
which means nothing to an API client; `json_loads` refuses it first, in plain words.
"""

from __future__ import annotations

import json
import math
from typing import Any

# Python's own default limit (sys.int_info.default_max_str_digits): every integer a
# client could send before is still read, and nothing longer reaches int().
MAX_INT_DIGITS = 4300


class NumberTooLongError(ValueError):
    """A JSON integer longer than MAX_INT_DIGITS digits."""

    def __init__(self) -> None:
        super().__init__(f"a number has more than {MAX_INT_DIGITS} digits")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise NumberTooLongError()
    return int(text)


def json_loads(text: str | bytes, **options: Any) -> Any:
    """`json.loads` for text from outside (options passed on): an integer of more than
    MAX_INT_DIGITS digits raises NumberTooLongError, a ValueError with a plain message."""
    return json.loads(text, parse_int=_bounded_int, **options)


class JSONRefusedError(ValueError):
    """JSON text from outside refused by its bounds; the message is a sentence that
    begins with the `what` the reader was given ("The JSON body is nested ...")."""


def json_read(text: str, *, what: str, max_depth: int, **options: Any) -> Any:
    """The value of JSON `text` from outside (an API body, a form field), within the
    bounds: no deeper than `max_depth`, nothing `json_problem` refuses, no integer past
    MAX_INT_DIGITS digits; else JSONRefusedError in words. Python's json module
    recurses, so a few thousand levels raise RecursionError before any depth check
    could run: that is caught here too."""
    try:
        value = json_loads(text, **options)
    except RecursionError as exc:
        raise JSONRefusedError(f"{what} is nested deeper than {max_depth} levels.") from exc
    except NumberTooLongError as exc:
        raise JSONRefusedError(
            f"{what} holds a number with more than {MAX_INT_DIGITS} digits."
        ) from exc
    except ValueError as exc:
        raise JSONRefusedError(f"{what} is not JSON: {exc}.") from exc
    problem = json_problem(value, max_depth=max_depth)
    if problem:
        raise JSONRefusedError(f"{what} {problem}.")
    return value


def json_problem(value: Any, *, max_depth: int) -> str | None:
    """The first reason `value` cannot be stored and passed on as JSON, or None.

    Depth counts containers: `{}` and `[]` are depth 1, `{"a": [1]}` depth 2.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > max_depth:
                return f"is nested deeper than {max_depth} levels"
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return "has an object key that is not a string"
                    problem = text_problem(key)
                    if problem:
                        return f"has an object key that {problem}"
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return f"has a string that {problem}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "has a number that is not finite (NaN or Infinity)"
        elif item is not None and not isinstance(item, bool | int):
            return f"has a value of type {type(item).__name__}, which is not JSON"
    return None


def text_problem(text: str) -> str | None:
    """What PostgreSQL cannot store of a text from outside (a form field, a reason), in
    words that follow "it", or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate (not valid Unicode)"
    return None
