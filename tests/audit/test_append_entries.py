"""audit_append_entries: a batch of entries in one statement, continuity checked per statement."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from audit.canonical import GENESIS_HASH, canonical_bytes, chain_hash, entry_payload
from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor, audit_append, audit_payload, format_ts
from audit.verification import audit_verify
from tests.processes import database_url

pytestmark = pytest.mark.django_db

APPEND = (
    "SELECT * FROM audit_append_entries(%s::text[], %s::uuid[], %s::bigint[], %s::text[], "
    "%s::text[], %s::text[], %s::timestamptz[], %s::text[], %s::text[])"
)


def entries(chain: str, seqs: list[int], prevs: list[str]) -> list[tuple]:
    """One tuple of column values per entry, with its payload, chained as given."""
    ts = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    return [
        (chain, None, seq, "progress", "system", "test", ts, payload(chain, seq, ts), prev)
        for seq, prev in zip(seqs, prevs, strict=True)
    ]


def payload(chain: str, seq: int, ts: datetime, job_id: uuid.UUID | None = None) -> str:
    value = audit_payload(
        chain=chain,
        seq=seq,
        ts=ts,
        event_type="progress",
        actor=Actor.system("test"),
        job_id=job_id,
        data={"n": seq},
    )
    return canonical_bytes(value).decode()


def chained(chain: str, first: int, count: int, prev: str = GENESIS_HASH) -> list[tuple]:
    """`count` entries that continue a head `prev` from seq `first`."""
    rows = []
    for seq in range(first, first + count):
        rows += entries(chain, [seq], [prev])
        prev = chain_hash(prev, rows[-1][7].encode())
    return rows


def append(rows: list[tuple], cursor=None) -> list[tuple]:
    arrays = [list(column) for column in zip(*rows, strict=True)]
    if cursor is None:
        with connection.cursor() as c:
            c.execute(APPEND, arrays)
            return c.fetchall()
    cursor.execute(APPEND, arrays)
    return cursor.fetchall()


def test_a_batch_of_several_chains_is_appended_in_order_and_verifies():
    a, b = f"test:{uuid.uuid4()}", f"test:{uuid.uuid4()}"
    first = chained(a, 1, 2)
    batch = chained(a, 3, 3, chain_hash(first[-1][8], first[-1][7].encode())) + chained(b, 1, 4)
    with transaction.atomic():
        append(first)
        returned = append(batch)
    assert [(r[1], r[3]) for r in returned] == [(e[0], e[2]) for e in batch]
    assert [r[0] for r in returned] == sorted(r[0] for r in returned)  # ids in array order
    for chain, count in ((a, 5), (b, 4)):
        rows = list(AuditLog.objects.filter(chain=chain).order_by("seq"))
        assert [r.seq for r in rows] == list(range(1, count + 1))
        assert rows[0].prev_hash == GENESIS_HASH
        assert all(y.prev_hash == x.chain_hash for x, y in itertools.pairwise(rows))
        assert all(r.chain_hash == chain_hash(r.prev_hash, r.payload.encode()) for r in rows)
    report = audit_verify(chains=[a, b])
    assert report.ok, report.problems


def test_the_barrier_is_taken_once_shared():
    with transaction.atomic(), connection.cursor() as cursor:
        append(chained(f"test:{uuid.uuid4()}", 1, 5), cursor)
        cursor.execute(
            "SELECT mode, count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND pid = pg_backend_pid() AND ((classid::bigint << 32) | objid::bigint) "
            "= audit_barrier_key() GROUP BY mode"
        )
        assert cursor.fetchall() == [("ShareLock", 1)]


def head(chain: str) -> AuditLog:
    return AuditLog.objects.filter(chain=chain).order_by("-seq").first()


def refusals(chain: str, top: AuditLog) -> dict[str, list[tuple]]:
    """Batches that do not continue `chain` (head `top`, seq 2), each by one rule."""
    h = top.chain_hash
    return {
        "gap": entries(chain, [4], [h]),
        "repeated seq": entries(chain, [2], [h]),
        "seq behind": entries(chain, [1], [h]),
        "wrong prev_hash": entries(chain, [3], [GENESIS_HASH]),
        "second row skips": chained(chain, 3, 1, h) + entries(chain, [5], [h]),
        "second row repeats": chained(chain, 3, 1, h) + entries(chain, [3], [h]),
        "second row forks": chained(chain, 3, 1, h) + entries(chain, [4], [h]),
        "restart at genesis": entries(chain, [1], [GENESIS_HASH]),
        "a good chain beside": chained(f"test:{uuid.uuid4()}", 1, 2) + entries(chain, [4], [h]),
    }


@pytest.mark.parametrize("case", list(refusals("", AuditLog(chain_hash="0" * 64))))
def test_a_batch_that_does_not_continue_its_chain_is_refused_whole(case):
    chain = f"test:{uuid.uuid4()}"
    with transaction.atomic():
        append(chained(chain, 1, 2))
    batch = refusals(chain, head(chain))[case]
    with (
        pytest.raises(IntegrityError, match="does not continue its chain") as refused,
        transaction.atomic(),
    ):
        append(batch)
    assert refused.value.__cause__.sqlstate == "23000"  # integrity_constraint_violation
    assert AuditLog.objects.filter(chain__in={e[0] for e in batch}).count() == 2


def test_a_first_entry_not_at_genesis_is_refused():
    chain = f"test:{uuid.uuid4()}"
    for batch in (entries(chain, [1], ["1" * 64]), entries(chain, [2], [GENESIS_HASH])):
        with pytest.raises(IntegrityError, match="does not continue"), transaction.atomic():
            append(batch)
    assert not AuditLog.objects.filter(chain=chain).exists()


def test_the_continuity_check_is_one_statement_trigger_with_a_transition_table():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname, tgtype, tgnewtable FROM pg_trigger "
            "WHERE tgrelid = 'audit_logs'::regclass AND NOT tgisinternal ORDER BY tgname"
        )
        triggers = {name: (tgtype, new) for name, tgtype, new in cursor.fetchall()}
    assert "audit_logs_insert_at_head" not in triggers
    tgtype, new_table = triggers["audit_logs_continue_heads"]
    # tgtype bits: 1 row-level, 2 before, 4 insert. Statement-level AFTER INSERT = 4.
    assert tgtype == 4
    assert new_table == "audit_new_rows"
    assert {"audit_logs_no_update_delete", "audit_logs_no_truncate"} <= set(triggers)


@pytest.mark.django_db(transaction=True)
def test_a_race_the_trigger_cannot_see_is_refused_at_commit_by_the_unique_constraint():
    """Two appenders without the chain lock both see an empty chain: the statement
    trigger passes both; the deferred unique constraints refuse the second at commit."""
    chain = f"test:{uuid.uuid4()}"
    url = database_url()
    with psycopg.connect(url) as first, psycopg.connect(url) as second:
        with first.cursor() as c:
            append(entries(chain, [1], [GENESIS_HASH]), c)
        with second.cursor() as c:
            append(entries(chain, [1], [GENESIS_HASH]), c)
        first.commit()
        # Named by the partition's copy of (chain, seq, part) or (chain, prev_hash, part).
        with pytest.raises(psycopg.errors.UniqueViolation, match=r"_chain_(seq|prev_hash)_part"):
            second.commit()
    assert AuditLog.objects.filter(chain=chain).count() == 1


def test_audit_append_composes_its_payload_in_sql_as_the_verifier_recomputes_it():
    data = {"\U0001f600": ["\x01\x7f\u00e9", 2**53 - 1, -3, None, True], "\ue000": {}, "a": []}
    with transaction.atomic():
        entry = audit_append(
            chain=OPS_CHAIN, event_type="queue_paused", actor=Actor.system(), data=data
        )
    expected = entry_payload(
        chain=OPS_CHAIN,
        seq=entry.seq,
        ts=format_ts(entry.ts),
        event_type="queue_paused",
        actor_type="system",
        actor_id="jobops",
        job_id=None,
        data=data,
    )
    assert entry.payload.encode() == canonical_bytes(expected)
    assert entry.chain_hash == chain_hash(entry.prev_hash, entry.payload.encode())
    report = audit_verify(chains=[OPS_CHAIN])
    assert report.ok, report.problems


JOB_APPEND = (
    "SELECT audit_append_job_entries(%s::uuid[], %s::bigint[], %s::text[], %s::text[], "
    "'progress', 'system', 'test', %s::timestamptz)"
)


def job_entries(job_ids: list[uuid.UUID], seq: int) -> list[str]:
    """Each job's entry `seq`, its payload as a job's."""
    ts = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    return [payload(f"job:{job_id}", seq, ts, job_id) for job_id in job_ids]


def test_the_job_writer_appends_one_entry_per_job_chain_as_the_general_one_does():
    jobs = [uuid.uuid4() for _ in range(3)]
    ts = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    heads = [GENESIS_HASH] * 3
    for seq in (1, 2):
        payloads = job_entries(jobs, seq)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(JOB_APPEND, [jobs, [seq] * 3, payloads, heads, ts])
            assert cursor.fetchone() == (3,)
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND mode = "
                "'ShareLock' AND pid = pg_backend_pid() AND ((classid::bigint << 32) | "
                "objid::bigint) = audit_barrier_key()"
            )
            assert cursor.fetchone() == (1,)
        heads = [chain_hash(h, p.encode()) for h, p in zip(heads, payloads, strict=True)]
    rows = list(AuditLog.objects.filter(job_id__in=jobs).order_by("id"))
    assert [(r.chain, r.seq) for r in rows] == [
        (f"job:{job}", seq) for seq in (1, 2) for job in jobs
    ]
    assert {(r.event_type, r.actor_type, r.actor_id, r.ts) for r in rows} == {
        ("progress", "system", "test", ts)
    }
    assert [r.chain_hash for r in rows[3:]] == heads
    # each hash over its own row (the verifier would also want the jobs' rows)
    assert all(r.chain_hash == chain_hash(r.prev_hash, r.payload.encode()) for r in rows)
    assert [r.prev_hash for r in rows[:3]] == [GENESIS_HASH] * 3


def test_the_job_writer_is_held_to_the_heads_by_the_same_trigger():
    job = uuid.uuid4()
    ts = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    with (
        pytest.raises(IntegrityError, match="does not continue its chain"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(JOB_APPEND, [[job], [2], job_entries([job], 2), [GENESIS_HASH], ts])
    with connection.cursor() as cursor:
        cursor.execute(JOB_APPEND, [[], [], [], [], ts])
        assert cursor.fetchone() == (0,)
    assert not AuditLog.objects.filter(job_id=job).exists()
