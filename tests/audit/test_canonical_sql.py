"""The SQL builder of what an entry hashes (audit/sql/canonical.sql) writes, byte for
byte, what the `rfc8785` package writes (the verifier's recomputation), and refuses
what JCS cannot represent. Each example sends a batch of values in one query."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
import rfc8785
from django.db import DataError, connection, transaction
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from audit.canonical import canonical_bytes, entry_payload
from audit.services import format_ts

pytestmark = pytest.mark.django_db

SAFE = 2**53 - 1
# Every character PostgreSQL text can hold: control characters, DEL, non-ASCII and
# astral characters; not U+0000 (jsonb refuses it) nor lone surrogates (not UTF-8).
CHARS = st.characters(blacklist_categories=["Cs"], min_codepoint=1)
TEXT = st.text(CHARS, max_size=10)
# Keys weighted towards the characters whose order differs between UTF-8 bytes and
# UTF-16 code units (U+E000..U+FFFF against astral characters) and towards ASCII.
KEYS = (
    st.text(
        st.sampled_from("aAz_\x00\x1f\x7f\u00e9\ue000\uffff\U00010000\U0001f600"), max_size=3
    ).map(lambda k: k.replace("\x00", "\x01"))
    | st.text(st.characters(max_codepoint=127, min_codepoint=1), max_size=6)
    | TEXT
)
# Numbers as the payloads may carry them: integers within JCS's range (and at its
# edges), and doubles below 1e16 (larger ones are refused: see test_refused_numbers).
NUMBERS = (
    st.integers(min_value=-SAFE, max_value=SAFE)
    | st.sampled_from([0, 1, -1, SAFE, -SAFE, 2**31, -(2**31) - 1, 2**32])
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-9.99e15, max_value=9.99e15)
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-1e-5, max_value=1e-5)
)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=16,
)
BATCH = st.lists(VALUES, min_size=1, max_size=25)
FAST = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def sql_canonical(values: list) -> list[str]:
    """audit_canonical of each value, in one query (json.dumps escapes every non-ASCII
    character, so what jsonb parses is exactly the Python value)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT audit_canonical(v) FROM unnest(%s::jsonb[]) WITH ORDINALITY AS t(v, i) "
            "ORDER BY i",
            [[json.dumps(v) for v in values]],
        )
        return [row[0] for row in cursor.fetchall()]


@FAST
@given(BATCH)
@example([{"\ue000": 1, "\U0001f600": 2, "": [], "a": {}, "\x7f": "\x00\x1f\x7f"[1:]}])
@example([["\u2028\u2029", "\ud7ff", '\\"/', "\b\f\n\r\t\x0b\x01"], 1e-7, 5e-324, -0.0])
@example([123456789012345.6, 0.1, 1e-6, 1.5e-7, 100.0, 9.99e15, -SAFE, SAFE])
def test_audit_canonical_is_rfc8785_byte_for_byte(values):
    assert sql_canonical(values) == [rfc8785.dumps(v).decode("utf-8") for v in values]


def test_a_deeply_nested_value():
    value: object = {"leaf": ["\u00e9", 1, None]}
    for depth in range(40):
        value = {f"k{depth}": value, "n": [depth, {"x": value}]} if depth < 6 else [value]
    assert sql_canonical([value]) == [rfc8785.dumps(value).decode("utf-8")]


@pytest.mark.parametrize(
    "number",
    [SAFE + 1, -SAFE - 1, 2**64, -(2**100), 1e16, -1.5e16, 1.7976931348623157e308],
)
def test_refused_numbers(number):
    """Integers past 2**53 - 1 are refused, as rfc8785 refuses them. jsonb keeps no
    distinction between 1e16 the double and the integer, so doubles from 1e16 on are
    refused too (rfc8785 would write them): hashed payloads carry no such floats."""
    if isinstance(number, int):
        with pytest.raises(rfc8785.IntegerDomainError):
            rfc8785.dumps(number)
    with pytest.raises(DataError, match="not representable in RFC 8785"), transaction.atomic():
        sql_canonical([{"n": [number]}])


def test_unicode_nul_never_reaches_the_builder():
    """JCS writes U+0000 as \\u0000; jsonb refuses it, so no payload the SQL builder
    composes can hold one (the Python writer refused none, but none was ever written:
    data comes from the database's own text, which cannot hold it either)."""
    with pytest.raises(DataError), transaction.atomic():
        sql_canonical(["a\x00b"])


# --- audit_entry_payload -----------------------------------------------------------------
ENTRIES = st.lists(
    st.fixed_dictionaries(
        {
            "chain": st.one_of(st.just("ops"), st.uuids().map(lambda u: f"job:{u}"), TEXT),
            "seq": st.integers(min_value=1, max_value=SAFE),
            "ts": st.datetimes(
                min_value=datetime(2000, 1, 1),
                max_value=datetime(2200, 1, 1),
                timezones=st.just(UTC),
            ),
            "event_type": TEXT,
            "actor_type": st.sampled_from(["user", "service", "operator", "system", "api_key"]),
            "actor_id": TEXT,
            "job_id": st.none() | st.uuids(),
            "data": st.dictionaries(KEYS, VALUES, max_size=4),
        }
    ),
    min_size=1,
    max_size=12,
)


@settings(FAST, max_examples=15)
@given(ENTRIES)
def test_audit_entry_payload_is_the_canonical_entry_payload(entries):
    columns = ["chain", "seq", "ts", "event_type", "actor_type", "actor_id", "job_id", "data"]
    arrays = [[e[c] for e in entries] for c in columns]
    arrays[columns.index("data")] = [json.dumps(e["data"]) for e in entries]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT audit_entry_payload(chain, seq, to_char(ts AT TIME ZONE 'UTC', "
            '\'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\'), event_type, actor_type, actor_id, job_id, data) '
            "FROM unnest(%s::text[], %s::bigint[], %s::timestamptz[], %s::text[], %s::text[], "
            "%s::text[], %s::uuid[], %s::jsonb[]) WITH ORDINALITY "
            "AS t(chain, seq, ts, event_type, actor_type, actor_id, job_id, data, i) ORDER BY i",
            arrays,
        )
        written = [row[0] for row in cursor.fetchall()]
    expected = [
        canonical_bytes(
            entry_payload(
                chain=e["chain"],
                seq=e["seq"],
                ts=format_ts(e["ts"]),
                event_type=e["event_type"],
                actor_type=e["actor_type"],
                actor_id=e["actor_id"],
                job_id=str(e["job_id"]) if e["job_id"] else None,
                data=e["data"],
            )
        ).decode("utf-8")
        for e in entries
    ]
    assert written == expected


def test_sql_null_data_is_an_empty_object_and_json_null_is_null():
    """As audit.services wrote `data or {}`; a JSON null stays null (entry_payload)."""
    job_id = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT audit_entry_payload('ops', 1, 't', 'e', 'system', 'x', %s, NULL), "
            "audit_entry_payload('ops', 1, 't', 'e', 'system', 'x', NULL, 'null')",
            [job_id],
        )
        empty, null = cursor.fetchone()
    assert empty == (
        '{"actor":{"id":"x","type":"system"},"chain":"ops","data":{},"event_type":"e",'
        f'"job_id":"{job_id}","seq":1,"ts":"t"}}'
    )
    assert '"data":null,' in null and '"job_id":null,' in null
