from __future__ import annotations

import pytest

from core.json import MAX_INT_DIGITS, NumberTooLongError, json_loads, json_problem


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_plain_json_has_no_problem():
    value = {"a": [1, 2.5, "x", None, True, {"b": []}], "c": -(2**70)}
    assert json_problem(value, max_depth=32) is None


def test_depth_counts_containers_up_to_the_limit():
    assert json_problem(nested(32), max_depth=32) is None
    assert json_problem(nested(33), max_depth=32) == "is nested deeper than 32 levels"
    assert json_problem([[[1]]], max_depth=2) == "is nested deeper than 2 levels"


def test_nesting_far_past_the_recursion_limit_is_reported_not_raised():
    value: list = []
    for _ in range(100_000):
        value = [value]
    assert json_problem(value, max_depth=32) == "is nested deeper than 32 levels"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": "x\x00y"}, "has a string that contains a NUL character"),
        ({"a\x00": 1}, "has an object key that contains a NUL character"),
        (["\ud800"], "has a string that contains an unpaired surrogate"),
        ({"a": float("nan")}, "has a number that is not finite"),
        ([float("inf")], "has a number that is not finite"),
        ({1: "a"}, "has an object key that is not a string"),
        ({"a": {1, 2}}, "has a value of type set"),
    ],
)
def test_values_postgres_or_json_refuse_are_named(value, problem):
    assert json_problem(value, max_depth=32).startswith(problem)


def test_json_loads_reads_integers_up_to_the_limit_and_refuses_longer_ones_plainly():
    assert json_loads("[" + "9" * MAX_INT_DIGITS + "]") == [int("9" * MAX_INT_DIGITS)]
    assert json_loads("-" + "9" * MAX_INT_DIGITS) == -int("9" * MAX_INT_DIGITS)
    for text in ("1" + "0" * 5000, '{"n": -' + "1" * 5000 + "}"):
        with pytest.raises(NumberTooLongError) as raised:
            json_loads(text)
        assert str(raised.value) == f"a number has more than {MAX_INT_DIGITS} digits"
