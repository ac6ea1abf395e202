"""A fuzz test of the API's inputs: nesting, NUL, surrogates, huge numbers, cursors.

Whatever arrives, the answer is never a 500, and every refusal is the one envelope.
Derandomized (the same cases every run), so a failure reproduces.
"""

from __future__ import annotations

import base64
import json
from urllib.parse import quote_from_bytes

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs"
FUZZ = settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Text with the characters that broke storage before: NUL and lone surrogates.
hostile_text = st.text(
    alphabet=st.sampled_from(["a", "é", "\x00", "\ud800", "\udfff", '"', "\\", "\n", "𝄞"]),
    max_size=12,
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | hostile_text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=20,
)
# Raw number texts json.dumps never writes: past float range, past Python's digit limit.
huge_numbers = st.sampled_from(["1e400", "-1e400", "9" * 5000, "1" + "0" * 400, "1e-400"])


def _assert_envelope(response) -> None:
    assert response.status_code < 500, response.content[:300]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["code"].startswith("ERR-") and isinstance(error["message"], str)


def _post_raw(api, text: str):
    return api.post(JOBS, text, content_type="application/json")


@FUZZ
@given(job_type=st.sampled_from(["sim", "cam", "model", "erp", "ai", "report", "nope"]),
       params=json_values, key=st.none() | hostile_text)  # fmt: skip
def test_any_json_body_is_answered_without_a_500(api, job_type, params, key):
    body = {"type": job_type, "params": params}
    if key is not None:
        body["idempotency_key"] = key
    _assert_envelope(_post_raw(api, json.dumps(body, allow_nan=True)))


@FUZZ
@given(depth=st.integers(min_value=1, max_value=20_000), opener=st.sampled_from("[{"))
def test_any_nesting_depth_is_answered_without_a_500(api, depth, opener):
    inner = "[" * depth + "]" * depth if opener == "[" else '{"a":' * depth + "1" + "}" * depth
    response = _post_raw(api, '{"type": "erp", "params": {"event": "x", "data": ' + inner + "}}")
    _assert_envelope(response)
    if depth > 32:
        assert response.status_code == 400


@FUZZ
@given(number=huge_numbers, where=st.sampled_from(["params", "steps"]))
def test_huge_numbers_are_answered_without_a_500(api, number, where):
    params = '{"steps": ' + number + "}" if where == "steps" else '{"x": ' + number + "}"
    _assert_envelope(_post_raw(api, '{"type": "sim", "params": ' + params + "}"))


@FUZZ
@given(
    cursor=st.one_of(
        hostile_text,
        st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()),
        st.builds(
            lambda o, p: base64.b64encode(_bytes(f"o={o}&r=0&p={p}")).decode(),
            st.integers(min_value=-5, max_value=10**6),
            hostile_text,
        ),
    ),
    status=st.none() | hostile_text,
)
def test_any_cursor_or_filter_is_answered_without_a_500(api, cursor, status):
    query = "cursor=" + quote_from_bytes(_bytes(cursor))
    if status is not None:
        query += "&status=" + quote_from_bytes(_bytes(status))
    _assert_envelope(api.get(f"{JOBS}?{query}"))


def _bytes(text: str) -> bytes:
    # A lone surrogate becomes the invalid UTF-8 a hostile client can send as it likes.
    return text.encode("utf-8", "surrogatepass")
