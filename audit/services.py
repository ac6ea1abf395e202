"""Appending to the audit chains. The only write path into `audit_logs`."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from audit.canonical import GENESIS_HASH, Hole, canonical_bytes, chain_hash
from audit.models import ActorType, AuditLog

OPS_CHAIN = "ops"
# Every append holds this advisory lock in shared mode until it commits; a checkpoint
# takes it exclusively (audit.checkpoints), which waits for in-flight appends and
# holds new ones for a moment, so that no row below a checkpoint's last_audit_id can
# commit after it. Advisory locks need no table privilege (LOCK TABLE would need
# UPDATE, which the app role must not have).
CHECKPOINT_BARRIER = "jobops:audit_checkpoint"


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


def job_chain(job_id: uuid.UUID | str) -> str:
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
    """What an entry hashes (docs/architecture.md): chain, seq, ts, actor, event type, job, data.

    The one definition of the payload, for `audit_append` and for the job chains that
    `jobs` appends in the statement of each transition (with `seq` as a Hole the
    database fills; see audit.canonical.canonical_template).
    """
    return {
        "chain": chain,
        "seq": seq,
        "ts": format_ts(ts),
        "event_type": event_type,
        "actor": {"type": str(actor.type), "id": actor.id},
        "job_id": str(job_id) if job_id else None,
        "data": data or {},
    }


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
       (including two first entries) queue up instead of forking it (and the shared
       checkpoint barrier, see CHECKPOINT_BARRIER).
    2. Read the head in a statement that starts after the lock (READ COMMITTED gives
       it a fresh snapshot that includes whatever the previous holder committed).
    3. Hash prev_hash + canonical payload and insert; the unique constraints on
       (chain, seq) and (chain, prev_hash) back the lock up.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("audit_append must run inside transaction.atomic()")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0)), "
            "pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [CHECKPOINT_BARRIER, chain],
        )
        cursor.execute(
            "SELECT seq, chain_hash FROM audit_logs WHERE chain = %s ORDER BY seq DESC LIMIT 1",
            [chain],
        )
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
    return AuditLog.objects.create(
        chain=chain,
        job_id=job_id,
        seq=seq,
        event_type=event_type,
        actor_type=actor.type,
        actor_id=actor.id,
        ts=ts,
        payload=payload.decode("utf-8"),
        prev_hash=prev_hash,
        chain_hash=chain_hash(prev_hash, payload),
    )
