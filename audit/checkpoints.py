"""Signed checkpoints of the audit chain heads (docs/architecture.md#checkpoints).

A hash chain alone cannot show that its tail, or the whole chain, was removed, nor
that someone holding the database rebuilt it with fresh hashes. A checkpoint records
the heads (chain, seq, chain_hash) of every chain that changed since the previous
checkpoint, is itself chained to that checkpoint, and carries an HMAC under a key
that lives outside the database (settings.AUDIT_SIGNING_KEYS, looked up by key id so
keys can rotate), and an Ed25519 signature of the same hash (audit.signing) that an
archive's reader verifies with the public key alone. Verification then checks that every
head still exists unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from datetime import datetime, timedelta

import structlog
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from audit.canonical import GENESIS_HASH, chain_hash
from audit.models import AuditCheckpoint, AuditLog
from audit.queries import QUERIES
from audit.services import format_ts
from audit.signing import sign
from audit.tree import canonical_heads, checkpoint_payload_v2
from audit.tree_log import tree_head_append

logger = logging.getLogger(__name__)
export_log = structlog.get_logger("audit.checkpoints")

# Version 2 (audit.tree): the payload commits to the heads through their Merkle root; the
# heads are stored beside it. Version 1 (heads in the payload) still verifies.
PAYLOAD_VERSION = 2
# Heads per checkpoint row. More changed chains than this (the first checkpoint of
# a large existing table) are written as several chained checkpoints in the same
# transaction, so that no payload grows past about 0.6 MB for writer or verifier.
MAX_HEADS = 5_000
# How long a checkpoint waits for in-flight audit appends (and for another
# checkpoint writer) before giving up until the next loop (see step 1 of `_write`).
LOCK_TIMEOUT = "5s"


class UnknownSigningKeyError(LookupError):
    """A checkpoint names a key id that settings.AUDIT_SIGNING_KEYS does not hold."""


def checkpoint_signature(*, key_id: str, checkpoint_hash: str) -> str:
    """HMAC-SHA256 over the checkpoint hash (which commits to payload and prev_hash)."""
    try:
        key = settings.AUDIT_SIGNING_KEYS[key_id]
    except KeyError:
        raise UnknownSigningKeyError(key_id) from None
    return hmac.new(key.encode("utf-8"), bytes.fromhex(checkpoint_hash), hashlib.sha256).hexdigest()


def checkpoint_write(*, now: datetime | None = None) -> AuditCheckpoint | None:
    """Record the heads of the chains that changed since the last checkpoint.

    Returns the new checkpoint, or None when no chain changed (nothing is written).
    Safe to run from several dispatchers at once.
    """
    return _write(now=now, due_seconds=None)


def checkpoint_write_if_due(*, now: datetime | None = None) -> AuditCheckpoint | None:
    """`checkpoint_write` at most every settings.AUDIT_CHECKPOINT_SECONDS (dispatcher loop)."""
    now = now or timezone.now()
    last = AuditCheckpoint.objects.order_by("-id").values("created_at", "last_audit_id").first()
    # Cheap pre-checks without any lock (`_write` checks again under it): the
    # dispatcher calls this every loop, and the barrier would hold appends each time.
    if last is not None and now - last["created_at"] < timedelta(
        seconds=settings.AUDIT_CHECKPOINT_SECONDS
    ):
        return None
    if not AuditLog.objects.filter(id__gt=last["last_audit_id"] if last else 0).exists():
        return None
    return _write(now=now, due_seconds=settings.AUDIT_CHECKPOINT_SECONDS)


def checkpoint_write_all_heads(*, now: datetime | None = None) -> list[AuditCheckpoint]:
    """Checkpoints of the head of every chain, changed or not (`audit_checkpoint
    --all-heads`, once after the upgrade to version 2), so that a chain last checkpointed
    by a version 1 checkpoint gets a proof (audit.proofs).

    The heads are read a page of MAX_HEADS at a time (a skip scan of the (chain, seq)
    index), without the barrier; each page is one checkpoint in its own short
    transaction under it, so appends wait milliseconds, not the whole scan. Each keeps
    the previous checkpoint's last_audit_id: it does not cover the ids it did not wait
    for, and the next regular checkpoint records whatever changed meanwhile again.
    """
    now = now or timezone.now()
    written: list[AuditCheckpoint] = []
    before: str | None = None
    while True:
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["all_heads_page"], {"before": before, "limit": MAX_HEADS})
            rows = cursor.fetchall()
        if not rows:
            return written
        before = rows[-1][0]
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["checkpoint_barrier"])
            previous = AuditCheckpoint.objects.order_by("-id").first()
            checkpoint = _insert(
                previous=previous,
                now=now,
                last_audit_id=previous.last_audit_id if previous else 0,
                heads=canonical_heads(rows),
            )
            tree_head_append(checkpoint)
        written.append(checkpoint)


def _write(*, now: datetime | None, due_seconds: int | None) -> AuditCheckpoint | None:
    """Write one checkpoint in one transaction.

    1. Take the checkpoint barrier (audit_barrier_key, audit/migrations/0004)
       exclusively, for the transaction. Every append (audit_append) holds it shared
       until it commits, so this
       waits for every in-flight append and holds new ones for the few milliseconds
       this transaction lasts. Without it, a row whose id was allocated before the
       checkpoint but committed after it would sit below `last_audit_id` and never be
       covered. It also makes concurrent checkpoint writers queue; the unique
       prev_hash backs that up (two checkpoints can never share a parent). If the
       lock is not had within LOCK_TIMEOUT the checkpoint is skipped until the next
       call. Nothing else is locked: readers and the verifier never wait.
    2. Read the previous checkpoint (a fresh statement after the lock, so it sees a
       concurrent writer's commit) and, if due_seconds is given, stop if it is recent.
    3. Find the chains with rows above its last_audit_id (an id range scan on the
       primary key) and their heads; none -> write nothing.
    4. Canonical payload, hash chained to the previous checkpoint, HMAC, insert
       (several rows, MAX_HEADS heads each, when many chains changed).
    """
    now = now or timezone.now()
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["lock_timeout_set"], {"timeout": LOCK_TIMEOUT})
                (saved_timeout, _) = cursor.fetchone()
                cursor.execute(QUERIES["checkpoint_barrier"])
                cursor.execute(QUERIES["lock_timeout_set"], {"timeout": saved_timeout})
                previous = AuditCheckpoint.objects.order_by("-id").first()
                if (
                    due_seconds is not None
                    and previous is not None
                    and now - previous.created_at < timedelta(seconds=due_seconds)
                ):
                    return None
                last_id = previous.last_audit_id if previous else 0
                cursor.execute(QUERIES["changed_heads"], {"last_id": last_id})
                rows = cursor.fetchall()
            if not rows:
                return None
            last_audit_id = rows[0][3]
            heads = canonical_heads((c, s, h) for c, s, h, _ in rows)
            checkpoint = previous
            for start in range(0, len(heads), MAX_HEADS):
                checkpoint = _insert(
                    previous=checkpoint,
                    now=now,
                    last_audit_id=last_audit_id,
                    heads=heads[start : start + MAX_HEADS],
                )
                tree_head_append(checkpoint)
            return checkpoint
    except OperationalError as exc:
        # lock_timeout: a long transaction holds an append open (or another writer is
        # busy). Never block the dispatcher on it; the rows stay above last_audit_id
        # for the next attempt.
        if getattr(exc.__cause__, "sqlstate", None) == "55P03":
            logger.warning("audit checkpoint skipped: in-flight audit appends did not drain")
            return None
        raise


def _insert(
    *,
    previous: AuditCheckpoint | None,
    now: datetime,
    last_audit_id: int,
    heads: list[dict[str, object]],
) -> AuditCheckpoint:
    prev_hash = previous.checkpoint_hash if previous else GENESIS_HASH
    key_id = settings.AUDIT_SIGNING_KEY_ID
    payload = checkpoint_payload_v2(
        created_at=format_ts(now),
        last_audit_id=last_audit_id,
        prev_hash=prev_hash,
        key_id=key_id,
        heads=heads,
    )
    digest = chain_hash(prev_hash, payload)
    checkpoint = AuditCheckpoint.objects.create(
        created_at=now,
        last_audit_id=last_audit_id,
        payload=payload.decode("utf-8"),
        prev_hash=prev_hash,
        checkpoint_hash=digest,
        key_id=key_id,
        signature=checkpoint_signature(key_id=key_id, checkpoint_hash=digest),
        ed25519_signature=sign(bytes.fromhex(digest)),
        heads=heads,
    )
    transaction.on_commit(lambda: checkpoint_export(checkpoint))
    return checkpoint


def checkpoint_export(checkpoint: AuditCheckpoint) -> None:
    """Put a committed checkpoint's hash where the database cannot reach it.

    A superuser who deletes the newest checkpoint and the rows after it leaves a
    consistent, shorter history; only a copy kept elsewhere shows it was longer.
    Every checkpoint goes to the structured log (ship it off the host) and, with
    AUDIT_CHECKPOINT_EXPORT set, is appended as one JSON line to that file (on
    storage the database's host cannot rewrite). `verify_audit_chain
    --expect-checkpoints-file` reads the file back.
    """
    record = {
        "id": checkpoint.id,
        "created_at": format_ts(checkpoint.created_at),
        "checkpoint_hash": checkpoint.checkpoint_hash,
        "prev_hash": checkpoint.prev_hash,
        "key_id": checkpoint.key_id,
        "signature": checkpoint.signature,
    }
    export_log.info("audit_checkpoint_written", **record)
    path = settings.AUDIT_CHECKPOINT_EXPORT
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(record, sort_keys=True) + "\n")
            file.flush()
            os.fsync(file.fileno())
    except OSError as exc:  # the checkpoint stands; the log line above still has it
        export_log.error("audit_checkpoint_export_failed", path=path, error=repr(exc))
