"""A drain reads each message's identity with `decode_identity`, which skips what only
recording a message needs; it must name every message exactly as the full decode
(`decode_amqp`) does, or a drain would ack the wrong copies or keep the right ones."""

from __future__ import annotations

import json
import uuid

import amqp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlq.broker import decode_amqp, decode_identity

TEXT = st.text(max_size=12)  # NUL, non-ASCII, astral characters and lone surrogates too
IDS = (
    st.none()
    | st.uuids().map(str)
    | TEXT
    | st.binary(max_size=12)
    | st.integers()
    | st.text(min_size=250, max_size=300)  # past the 255 characters of a message id
    | st.dictionaries(TEXT, TEXT, max_size=2)
)
ATTEMPTS = st.none() | st.integers(min_value=-3, max_value=10) | TEXT


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["celery", "celery-v1", "json", "garbage", "deep"]))
    payload = {"job_id": draw(IDS | st.uuids().map(str)), "attempt": draw(ATTEMPTS)}
    if kind == "celery":
        value: object = [[payload], {}, {"callbacks": None}]
    elif kind == "celery-v1":
        value = {"args": [payload], "kwargs": {}}
    elif kind == "json":
        value = draw(st.lists(st.integers(), max_size=3) | st.dictionaries(TEXT, TEXT))
    elif kind == "deep":
        value = [payload]
        for _ in range(draw(st.integers(min_value=10, max_value=80))):
            value = [value]
    else:
        return draw(st.binary(max_size=40))
    try:
        return json.dumps(value).encode()
    except (TypeError, ValueError):  # bytes in the payload: not JSON
        return b"\xff" + repr(value).encode()


@st.composite
def messages(draw: st.DrawFn) -> amqp.Message:
    headers: dict[str, object] = {}
    for key in ("id", "job_id"):
        if draw(st.booleans()):
            headers[key] = draw(IDS)
    if draw(st.booleans()):
        headers["x-death"] = [
            {"queue": draw(st.sampled_from(["default", "sim", "elsewhere"])), "reason": "rejected"}
        ]
    properties = {"application_headers": headers}
    if draw(st.booleans()):
        properties["message_id"] = draw(TEXT | st.text(min_size=250, max_size=300))
    if draw(st.booleans()):
        properties["content_type"] = draw(st.sampled_from(["application/json", "text/plain"]))
    message = amqp.Message(draw(bodies()), **properties)
    message.delivery_info = {"routing_key": "default", "delivery_tag": 1}
    return message


def _identity(message: amqp.Message) -> tuple[object, ...]:
    decoded = decode_identity(message)
    return decoded.message_id, decoded.job_id, decoded.attempt


def _full(message: amqp.Message) -> tuple[object, ...]:
    decoded = decode_amqp(message)
    return decoded.message_id, decoded.job_id, decoded.attempt


def _drain_against_full_decode(name: str, max_examples: int):
    """The drain's identity against the full decode on `max_examples` generated
    messages."""

    @settings(max_examples=max_examples, deadline=None)
    @given(messages())
    def test(message):
        assert _identity(message) == _full(message)

    test.__name__ = test.__qualname__ = name
    return test


# A bounded sample in `make test` (docs/development.md#the-test-budget: 600 messages took
# about 20 s of one core under the coverage tracer), the whole 600 in `make test-heavy`.
test_a_drain_names_every_message_as_the_full_decode_does = _drain_against_full_decode(
    "test_a_drain_names_every_message_as_the_full_decode_does", 100
)
test_a_drain_names_every_message_as_the_full_decode_does_fully = pytest.mark.heavy(
    _drain_against_full_decode(
        "test_a_drain_names_every_message_as_the_full_decode_does_fully", max_examples=600
    )
)


def test_a_jobops_message_is_named_by_its_task_id_job_and_attempt():
    job_id = str(uuid.uuid4())
    body = json.dumps([[{"job_id": job_id, "attempt": 2}], {}, {}]).encode()
    message = amqp.Message(
        body, application_headers={"id": "t-1", "job_id": job_id}, content_type="application/json"
    )
    assert _identity(message) == ("task:t-1", job_id, 2) == _full(message)


def test_a_body_with_a_5000_digit_number_is_named_without_python_internals():
    body = b'[[{"job_id": "x", "attempt": 1' + b"0" * 5000 + b"}], {}, {}]"
    message = amqp.Message(body, application_headers={})
    decoded = decode_amqp(message)
    assert "more than 4300 digits" in decoded.decode_error
    assert "sys." not in decoded.decode_error
