"""Appending to the audit chains (docs/architecture.md#the-audit-chain).

Every entry is written by the SQL function `audit_append` (audit/migrations/0004), the
only statement that inserts into audit_logs: here for the ops chain and every chain
that is not a job's, and inside each job transition's statement (jobs/queries.sql) for a
job's chain. This module holds the Python half of the rule: the entry's payload
(`audit_payload`, hashed as audit.canonical writes it) and a job's chain name.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from audit.canonical import GENESIS_HASH, Hole, canonical_bytes, entry_payload
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
    seq: int | Hole,
    ts: datetime,
    event_type: str,
    actor: Actor,
    job_id: uuid.UUID | str | None,
    data: dict[str, Any] | None,
) -> dict[str, Any]:
    """What an entry hashes (audit.canonical.entry_payload), for `audit_append` and for
    the job chains that `jobs` appends in the statement of each transition (with `seq`
    as a Hole the database fills; see audit.canonical.canonical_template).
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
       it a fresh snapshot that includes whatever the previous holder committed).
    3. The canonical payload, appended by `audit_append`, which takes the checkpoint
       barrier, hashes prev_hash + payload and inserts; the unique constraints on
       (chain, seq) and (chain, prev_hash) back the lock up.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("audit_append must run inside transaction.atomic()")
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["chain_lock"], {"chain": chain})
        cursor.execute(QUERIES["chain_head"], {"chain": chain})
        head = cursor.fetchone()
    seq, prev_hash = (head[0] + 1, head[1]) if head else (1, GENESIS_HASH)
    ts = timezone.now()
    payload = canonical_bytes(
        audit_payload(
            chain=chain,
            seq=seq,
            ts=ts,
            event_type=event_type,
            actor=actor,
            job_id=job_id,
            data=data,
        )
    )
    params = {
        "chain": chain,
        "job_id": job_id,
        "seq": seq,
        "event_type": event_type,
        "actor_type": str(actor.type),
        "actor_id": actor.id,
        "ts": ts,
        "payload": payload.decode("utf-8"),
        "prev_hash": prev_hash,
    }
    return AuditLog.objects.raw(QUERIES["append"], params)[0]
