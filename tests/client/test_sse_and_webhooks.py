"""The Python client's pieces that need no jobops: the Server-Sent Events decoder
(clients/python/src/jobops_client/sse.py) and webhook verification (webhooks.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from jobops_client import SSEDecoder, WebhookVerificationError, webhooks
from jobops_client.sse import MAX_EVENT_BYTES, StreamError, iter_events


def decode(text: str, decoder: SSEDecoder | None = None):
    decoder = decoder or SSEDecoder()
    return list(iter_events(text.splitlines(), decoder)), decoder


# --- the SSE decoder --------------------------------------------------------------------


def test_events_are_dispatched_at_a_blank_line_with_their_type_data_and_id():
    events, decoder = decode(
        ": keep-alive\n"
        'id: 7\nevent: job.progress\ndata: {"percent": 40}\n\n'
        "data: first line\ndata:second line\ndata\n\n"  # one space stripped, at most
        "id: 9\nevent: job.status.changed\ndata:  spaced\n\n"
    )
    assert [(e.event, e.data, e.id) for e in events] == [
        ("job.progress", '{"percent": 40}', "7"),
        ("message", "first line\nsecond line\n", "7"),  # the id carries over
        ("job.status.changed", " spaced", "9"),
    ]
    assert decoder.last_event_id == "9"


def test_an_event_cut_off_by_the_end_of_the_stream_is_dropped_with_its_id():
    events, decoder = decode("id: 3\ndata: whole\n\nid: 4\ndata: cut")
    assert [e.id for e in events] == ["3"]
    assert decoder.last_event_id == "3"  # a resume asks from 3: event 4 comes again


def test_an_id_alone_counts_and_an_id_with_nul_or_a_bad_retry_is_ignored():
    events, decoder = decode("id: 5\n\nretry: 250\nid: x\0y\nretry: soon\ndata: d\n\n")
    assert [e.id for e in events] == ["5"]
    assert (decoder.last_event_id, decoder.retry_ms) == ("5", 250)


def test_a_resumed_decoder_starts_from_the_last_id():
    events, _ = decode("data: again\n\n", SSEDecoder(last_event_id="12"))
    assert events[0].id == "12"


def test_an_event_over_the_bound_is_refused():
    decoder = SSEDecoder()
    decoder.feed("data: " + "x" * (MAX_EVENT_BYTES // 2))
    with pytest.raises(StreamError):
        decoder.feed("data: " + "x" * (MAX_EVENT_BYTES // 2))


# --- webhooks ---------------------------------------------------------------------------

KEY = b"a secret of the endpoint, 32 b!!"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
NOW = 1_800_000_000
BODY = b'{"type": "job.status.changed", "job_id": "0193"}'


def signed(msg_id: str, timestamp: int, body: bytes, key: bytes = KEY) -> str:
    """The signature computed here with hmac, apart from the client's code."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(signature: str, timestamp: int = NOW, msg_id: str = "msg_1") -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
    }


def test_a_signed_webhook_verifies_and_answers_its_payload():
    good = signed("msg_1", NOW, BODY)
    assert webhooks.verify(headers(good), BODY, SECRET, now=NOW) == json.loads(BODY)
    # Header names in any case, the body as text, the clock 4 minutes off either way.
    upper = {name.title(): value for name, value in headers(good).items()}
    assert webhooks.verify(upper, BODY.decode(), SECRET, now=NOW + 240)
    assert webhooks.verify(headers(good), BODY, SECRET, now=NOW - 240)


def test_the_standard_webhooks_published_vector():
    vector = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    body = b'{"test": 2432232314}'
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    assert webhooks.verify(vector, body, secret, now=1614265330) == {"test": 2432232314}


def test_one_matching_signature_of_several_is_enough():
    rotated = signed("msg_1", NOW, BODY, key=b"the previous secret")
    both = f"v1,{base64.b64encode(b'x' * 32).decode()} {rotated} {signed('msg_1', NOW, BODY)}"
    assert webhooks.verify(headers(both), BODY, SECRET, now=NOW)


@pytest.mark.parametrize(
    ("sent", "body", "now", "why"),
    [
        (headers(signed("msg_1", NOW, BODY)), BODY + b" ", NOW, "No signature matches"),
        (headers(signed("msg_1", NOW, BODY), msg_id="msg_2"), BODY, NOW, "No signature"),
        (headers(signed("msg_1", NOW, BODY)), BODY, NOW + 301, "too old"),
        (headers(signed("msg_1", NOW, BODY)), BODY, NOW - 301, "too new"),
        (headers("v2," + signed("msg_1", NOW, BODY)[3:]), BODY, NOW, "No signature"),
        ({"webhook-id": "msg_1", "webhook-timestamp": str(NOW)}, BODY, NOW, "webhook-signature"),
        (headers(signed("msg_1", NOW, BODY), timestamp="soon"), BODY, NOW, "not a number"),
    ],
    ids=["tampered body", "other id", "old", "future", "other scheme", "unsigned", "bad time"],
)
def test_a_webhook_that_does_not_verify_is_refused(sent, body, now, why):
    with pytest.raises(WebhookVerificationError, match=why):
        webhooks.verify(sent, body, SECRET, now=now)


def test_a_secret_that_is_not_base64_is_refused():
    with pytest.raises(WebhookVerificationError, match="whsec_"):
        webhooks.verify(headers(signed("msg_1", NOW, BODY)), BODY, "whsec_not base64!", now=NOW)
