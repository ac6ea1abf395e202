"""Appending to the audit chains (docs/architecture.md#the-audit-chain).

Every entry is written by the SQL functions of audit/sql/append.sql, the only
statements that insert into audit_logs: here for the ops chain and every chain that is
not a job's, and inside each job transition's statement for a job's chain. What an
entry hashes is composed in SQL too (`audit_entry_payload`, audit/sql/canonical.sql);
`audit_payload` is its Python layout, which verification and tests compare with.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from audit.canonical import GENESIS_HASH, entry_payload
from audit.models import ActorType, AuditLog
from audit.queries import QUERIES

OPS_CHAIN = "ops"


@dataclass(frozen=True)
class Actor:
    type: str
    id: str

    @classmethod
    def system(cls, name: str = "jobops") -> Actor:
        return cls(ActorType.SYSTEM, name)

    @classmethod
    def user(cls, user: Any) -> Actor:
        # The user's primary key, never the username: personal data stays out of hashes.
        return cls(ActorType.USER, str(user.pk))

    @classmethod
    def operator(cls, user: Any) -> Actor:
        """A staff member acting on others' work from the portal or the admin API
        (replay, discard, cancel of another's job, bulk actions): audited apart from
        what users do to their own jobs."""
        return cls(ActorType.OPERATOR, str(user.pk))


def job_chain(job_id: uuid.UUID | str) -> str:
    """A job's chain name; the SQL side's is audit_job_chain (audit/migrations/0004)."""
    return f"job:{job_id}"


def format_ts(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def audit_payload(
    *,
    chain: str,
    seq: int,
    ts: datetime,
    event_type: str,
    actor: Actor,
    job_id: uuid.UUID | str | None,
    data: dict[str, Any] | None,
) -> dict[str, Any]:
    """What an entry hashes (audit.canonical.entry_payload), as a Python value: what
    the verifier and the tests compare with. Every writer composes it in SQL
    (audit_entry_payload): `audit_append` and the job transitions alike.
    """
    return entry_payload(
        chain=chain,
        seq=seq,
        ts=format_ts(ts),
        event_type=event_type,
        actor_type=str(actor.type),
        actor_id=actor.id,
        job_id=str(job_id) if job_id else None,
        data=data or {},
    )


def audit_append(
    *,
    chain: str,
    event_type: str,
    actor: Actor,
    job_id: uuid.UUID | str | None = None,
    data: dict[str, Any] | None = None,
) -> AuditLog:
    """Append one entry to `chain`; must run inside the caller's transaction.

    For every chain but a job's: a job keeps its chain's head on its row, and `jobs`
    appends to it in the same statement as the change it records (one round trip); an
    entry appended here to a job's chain would leave that head behind, and the
    insert-at-head trigger would refuse the job's next entry.

    1. Take a transaction-scoped advisory lock on the chain, so concurrent appenders
       (including two first entries) queue up instead of forking it.
    2. Read the head in a statement that starts after the lock (READ COMMITTED gives
       it a fresh snapshot that includes whatever the previous holder committed): in
       the partition of this entry's month first, then in the earlier ones
       (docs/architecture.md#partitions).
    3. Append in one statement: `audit_entry_payload` composes the canonical payload
       from the same values, `audit_append_entries` takes the checkpoint barrier,
       hashes prev_hash + payload and inserts; the statement trigger and the unique
       constraints on (chain, seq) and (chain, prev_hash) back the lock up.

    `data` holds JSON values only; a float of magnitude 1e16 or more, or an integer
    past 2**53 - 1, is refused (audit/sql/canonical.sql).
    """
    if not connection.in_atomic_block:
        raise RuntimeError("audit_append must run inside transaction.atomic()")
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["chain_lock"], {"chain": chain})
        # After the lock: each entry's ts, hence its partition, follows its predecessor's.
        ts = timezone.now()
        cursor.execute(QUERIES["chain_head"], {"chain": chain, "ts": ts})
        head = cursor.fetchone()
    seq, prev_hash = (head[0] + 1, head[1]) if head else (1, GENESIS_HASH)
    params = {
        "chain": chain,
        "job_id": job_id,
        "seq": seq,
        "event_type": event_type,
        "actor_type": str(actor.type),
        "actor_id": actor.id,
        "ts": ts,
        # JSON text for jsonb; the SQL builder writes it canonical (audit/sql/canonical.sql).
        "data": json.dumps(data or {}),
        "prev_hash": prev_hash,
    }
    return AuditLog.objects.raw(QUERIES["append"], params)[0]
