"""Ids as the portal shows and searches them (core/ids.py)."""

from __future__ import annotations

import uuid

import pytest

from core.ids import IdFragment, id_fragment, short_id

JOB_ID = "01a214d2-9f3c-7a1b-8e4d-5c6b7a8f9e0d"


def test_short_id_is_the_random_end_of_the_id():
    assert short_id(uuid.UUID(JOB_ID)) == "…5c6b7a8f9e0d"


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("…5c6b7a8f9e0d", IdFragment("5c6b7a8f9e0d", start=False, end=True)),  # as shown
        ("...9E0D", IdFragment("9e0d", start=False, end=True)),
        ("01a214d2…", IdFragment("01a214d2", start=True, end=False)),
        (" 8e4d-5c6b7a8f9e0d ", IdFragment("8e4d5c6b7a8f9e0d")),  # either end
        ("8e4d5c6b7a8f9e0d", IdFragment("8e4d5c6b7a8f9e0d")),
    ],
)
def test_id_fragment_reads_what_an_operator_types(term, expected):
    assert id_fragment(term) == expected


@pytest.mark.parametrize(
    "term", ["", "…", "abc", "%abcd", "ab_cd", "abcd\x00", "g123", "a" * 32, "a" * 5000, "----"]
)
def test_id_fragment_refuses_what_is_no_part_of_an_id(term):
    assert id_fragment(term) is None


def test_a_fragment_knows_its_range_and_its_dashed_end():
    fragment = IdFragment("7a1b8e4d5c6b7a8f9e0d")
    assert fragment.prefix_range() == (
        uuid.UUID("7a1b8e4d-5c6b-7a8f-9e0d-000000000000"),
        uuid.UUID("7a1b8e4d-5c6b-7a8f-9e0d-ffffffffffff"),
    )
    assert fragment.suffix_text() == "7a1b-8e4d-5c6b7a8f9e0d"
    assert JOB_ID.endswith(fragment.suffix_text())
