"""What a job's audit entry hashes, as the transition functions compose it
(jobs_entry_payload, jobs/sql/10_entries.sql): byte for byte what the `rfc8785` package
writes for the entry (the verifier's recomputation), whether its data takes the
concatenated path (jobs_entry_data: keys the jobs app writes) or audit_canonical's."""

from __future__ import annotations

import json
import re
import uuid

import pytest
import rfc8785
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.canonical import canonical_bytes, entry_payload
from core import sqlfiles
from tests.audit.test_canonical_sql import FAST, KEYS, SAFE, TEXT, VALUES

pytestmark = pytest.mark.django_db

ENTRIES = sqlfiles.ROOT / "jobs" / "sql" / "10_entries.sql"
DATA_FUNCTION = next(f for f in sqlfiles.functions([ENTRIES]) if f.name == "jobs_entry_data")
# The keys jobs_entry_data concatenates, in the order it writes them.
KNOWN = re.findall(r"p_data \? '([a-z0-9_]+)'", DATA_FUNCTION.body)
TS = "2026-11-29T12:00:00.000000Z"

CONTEXTS = st.fixed_dictionaries(
    {
        "correlation_id": st.none() | TEXT,
        "job_type": TEXT.filter(bool),
        "org_id": st.integers(min_value=1, max_value=SAFE),
        "project_id": st.none() | st.integers(min_value=1, max_value=SAFE),
        "request_id": st.none() | TEXT,
    }
)
# Data as the transitions write it (known keys), with now and then a key of another
# caller (audit_canonical's path) or a `context` of the caller's (the row's wins).
DATA = st.dictionaries(st.sampled_from(KNOWN), VALUES, max_size=6) | st.dictionaries(
    st.sampled_from(KNOWN) | KEYS | st.just("context"), VALUES, max_size=5
)


def test_the_known_keys_are_in_jcs_order_and_are_the_keys_it_accepts():
    assert len(KNOWN) > 10
    assert KNOWN == sorted(KNOWN, key=lambda k: k.encode("utf-8"))
    accepted = re.search(r"p_data - '\{([a-z0-9_,]+)\}'::text\[\]", DATA_FUNCTION.body)
    assert accepted is not None
    assert accepted.group(1).split(",") == sorted([*KNOWN, "context"], key=str.encode)
    # "context" sits where JCS puts it among the others
    assert re.search(r"'\"context\":' \|\| p_context", DATA_FUNCTION.body)


def sql_payloads(entries: list[dict]) -> list[tuple[str, str | None]]:
    """(jobs_entry_payload, jobs_entry_data) of each entry, its job a row value."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT jobs_entry_payload(j.id, j.audit_seq + 1, j.correlation_id, j.type, "
            "j.org_id, j.project_id, t.data, 'progress', 'system', 'worker', %s, "
            "t.ctx->>'request_id'), "
            "jobs_entry_data(t.data, '{}') "
            "FROM unnest(%s::jsonb[], %s::jsonb[], %s::jsonb[]) WITH ORDINALITY "
            "AS t(job, data, ctx, i) "
            "CROSS JOIN LATERAL jsonb_populate_record(NULL::jobs, t.job) AS j ORDER BY t.i",
            [
                TS,
                [json.dumps(e["job"]) for e in entries],
                [json.dumps(e["data"]) for e in entries],
                [json.dumps(e["context"]) for e in entries],
            ],
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]


def expected_payload(entry: dict) -> str:
    job = entry["job"]
    return canonical_bytes(
        entry_payload(
            chain=f"job:{job['id']}",
            seq=job["audit_seq"] + 1,
            ts=TS,
            event_type="progress",
            actor_type="system",
            actor_id="worker",
            job_id=job["id"],
            data={**entry["data"], "context": entry["context"]},
        )
    ).decode("utf-8")


def entry_of(data: dict, context: dict, seq: int) -> dict:
    job = {
        "id": str(uuid.uuid4()),
        "audit_seq": seq,
        "correlation_id": context["correlation_id"],
        "type": context["job_type"],
        "org_id": context["org_id"],
        "project_id": context["project_id"],
    }
    return {"job": job, "data": data, "context": context}


@settings(FAST, max_examples=40)
@given(st.lists(st.tuples(DATA, CONTEXTS, st.integers(0, 10**6)), min_size=1, max_size=12))
def test_jobs_entry_payload_is_the_canonical_entry_payload(batch):
    entries = [entry_of(data, context, seq) for data, context, seq in batch]
    written = sql_payloads(entries)
    assert [payload for payload, _ in written] == [expected_payload(e) for e in entries]
    for entry, (_, concatenated) in zip(entries, written, strict=True):
        known = set(entry["data"]) <= {*KNOWN, "context"}
        # jobs_entry_data takes exactly the data of known keys, and writes it as JCS does
        assert (concatenated is not None) == known
        if known:
            expected = rfc8785.dumps({**entry["data"], "context": {}}).decode("utf-8")
            assert concatenated == expected


# What most transitions write (from, to, attempt), which jobs_entry_payload composes
# itself; now and then with values of other types, which must take the general path.
TRANSITION_DATA = st.fixed_dictionaries(
    {"from": TEXT, "to": TEXT, "attempt": st.integers(0, SAFE)}
) | st.fixed_dictionaries({"from": VALUES, "to": VALUES, "attempt": VALUES})


@settings(FAST, max_examples=40)
@given(
    st.lists(st.tuples(TRANSITION_DATA, CONTEXTS, st.integers(0, 10**6)), min_size=1, max_size=12)
)
def test_from_to_and_attempt_alone_are_written_as_rfc8785_writes_them(batch):
    entries = [entry_of(data, context, seq) for data, context, seq in batch]
    written = sql_payloads(entries)
    assert [payload for payload, _ in written] == [expected_payload(e) for e in entries]


def test_what_the_transitions_write_takes_the_concatenated_path():
    """The shapes the executors write at every claim, progress and end: no
    audit_canonical call for their data (the cost this path exists to avoid)."""
    context = {
        "correlation_id": None,
        "job_type": "sim",
        "org_id": 1,
        "project_id": None,
        "request_id": None,
    }
    shapes = [
        {"from": "queued", "to": "running", "attempt": 1},
        {"percent": 50, "step": "half", "attempt": 1},
        {"from": "running", "to": "succeeded", "attempt": 1},
        {"from": "running", "to": "retrying", "attempt": 1, "delay_ms": 500, "error_code": "X"},
        {"from": "running", "to": "failed", "attempt": 3, "error_code": "X", "dead_letter_id": 7},
    ]
    entries = [entry_of(data, context, 2) for data in shapes]
    written = sql_payloads(entries)
    assert all(concatenated is not None for _, concatenated in written)
    assert [payload for payload, _ in written] == [expected_payload(e) for e in entries]


def test_no_data_is_an_empty_object_as_audit_entry_payload_writes_it():
    job = {"id": str(uuid.uuid4()), "audit_seq": 0, "type": "sim", "org_id": 1}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT jobs_entry_payload(j.id, j.audit_seq + 1, j.correlation_id, j.type, "
            "j.org_id, j.project_id, NULL, 'e', 'system', 'x', 't', NULL) "
            "FROM jsonb_populate_record(NULL::jobs, %s::jsonb) AS j",
            [json.dumps(job)],
        )
        (payload,) = cursor.fetchone()
    assert '"data":{},' in payload
