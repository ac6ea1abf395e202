"""Canonical JSON (RFC 8785): the fast path writes exactly what the reference library
writes, byte for byte, or refuses what it refuses (every chain hash depends on it)."""

from __future__ import annotations

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.canonical import canonical_bytes
from jobs.domain.states import Status

ASCII = st.text(alphabet=st.characters(max_codepoint=127), max_size=12)
ANY_TEXT = st.text(max_size=12)  # non-ASCII, astral characters and lone surrogates too
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.integers(min_value=-(2**53) - 2, max_value=-(2**53) + 2)
    | st.integers(min_value=2**53 - 2, max_value=2**53 + 2)
    | st.floats(allow_nan=False, allow_infinity=False)
    | ASCII
    | ANY_TEXT
    | st.sampled_from(list(Status))
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(ASCII | ANY_TEXT, inner, max_size=4),
    max_leaves=20,
)


def _outcome(encode, value):
    try:
        return encode(value)
    except Exception as exc:  # both must refuse the same values
        return type(exc).__name__


def _against_the_reference(name: str, max_examples: int):
    """canonical_bytes against rfc8785's reference on `max_examples` generated values
    (derandomized: the same values every run)."""

    @settings(max_examples=max_examples, derandomize=True, deadline=None)
    @given(VALUES)
    def test(value):
        assert _outcome(canonical_bytes, value) == _outcome(rfc8785.dumps, value)

    test.__name__ = test.__qualname__ = name
    return test


# A bounded sample in `make test` (docs/development.md#the-test-budget: 600 values took
# about 20 s of one core under the coverage tracer), the whole 600 in `make test-heavy`.
test_canonical_bytes_are_the_reference_bytes = _against_the_reference(
    "test_canonical_bytes_are_the_reference_bytes", 100
)
test_canonical_bytes_are_the_reference_bytes_fully = pytest.mark.heavy(
    _against_the_reference("test_canonical_bytes_are_the_reference_bytes_fully", 600)
)


def test_a_typical_payload_and_every_ascii_character():
    payload = {
        "chain": "job:0b7c6f0e-1f6b-4a51-9d0f-0e6a6c1d2b3e",
        "seq": 3,
        "data": {"to": Status.QUEUED, "text": "".join(map(chr, range(128))), "n": -(2**53) + 1},
        "actor": {"type": "system", "id": None},
        "ok": [True, False],
    }
    assert canonical_bytes(payload) == rfc8785.dumps(payload)
