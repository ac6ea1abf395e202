"""Verify the audit chains and the signed checkpoints (docs/architecture.md#verification).

Rows are streamed through server-side cursors ordered by (chain, seq), so memory
stays flat whatever the table size; a large table is read in a few chain ranges side
by side, on one snapshot. Each row is checked against the exact payload
bytes that were hashed at write time; the checkpoints then prove that no head they
recorded has gone missing or been rewritten.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.utils.module_loading import import_string
from psycopg import sql as pgsql

from audit.boundary import live_boundary
from audit.canonical import GENESIS_HASH, canonical_bytes, entry_payload
from audit.checkpoint_check import checkpoint_problems as checkpoint_problems
from audit.queries import QUERIES
from audit.report import MAX_PROBLEMS as MAX_PROBLEMS
from audit.report import Problem as Problem
from audit.report import VerificationReport as VerificationReport
from audit.report import job_of as _job_of
from audit.services import job_chain
from audit.tree_check import check_tree_heads

# Rows fetched per round trip of the server-side cursor: large enough that the
# round trips vanish, small enough that a batch is about a megabyte.
BATCH_ROWS = 2_000


def audit_verify(
    *,
    job_ids: Iterable[uuid.UUID | str] | None = None,
    since: datetime | None = None,
    chains: Iterable[str] | None = None,
    expected_checkpoints: Iterable[str] = (),
    history: Any = None,
) -> VerificationReport:
    """Verify chains and checkpoints; never raises for tampering, reports it.

    1. Choose the chains: all, or those of `job_ids`/`chains`, narrowed by `since`
       to chains with a row at or after it (still verified from seq 1).
    2. Stream the rows ordered by (chain, seq) and check each (`_check_rows`).
    3. Verify the checkpoint chain: link, hash, HMAC signature, known key id, and
       that the columns agree with the signed payload (a version 2 one's heads with its
       heads_root). A full verification (no chains chosen) also recomputes the
       checkpoint log from the checkpoints (audit.tree_check).
    4. For the checkpoints that proved genuine, check in SQL that every head they
       name (restricted to the chosen chains, plus every head of a checkpoint made
       at or after `since`) still exists with that hash.
    5. Every checkpoint hash exported earlier (`expected_checkpoints`, see
       audit.checkpoints.checkpoint_export) must still be a genuine checkpoint: a
       deleted tail took the newest checkpoints with it.
    6. The checks of AUDIT_VERIFY_CHECKS, e.g. each job's status against the last
       transition in its chain (a chain that stops short). Each is called as
       `check(report, chains, requested=..., since=...)`: the chosen chains, those
       the caller named (None: all) and `since`.
    Runs in one REPEATABLE READ READ ONLY transaction when it can, so rows and
    checkpoints come from one snapshot.

    Once partitions were detached (audit.boundary.Boundary, `history`; read from the
    ops chain when not given): a chain whose older segments went starts after them, the
    heads of checkpoints whose partition went are checked against its archive (with
    `history` from verify_audit_chain --archives) or counted apart, and every partition
    must be attached or detached by audit_detach.
    """
    started = time.perf_counter()
    report = VerificationReport()
    selected: list[str] | None = None
    if job_ids is not None or chains is not None:
        selected = sorted(
            {job_chain(j) for j in (job_ids or [])} | {str(c) for c in (chains or [])}
        )
    requested = selected
    with transaction.atomic():
        if len(connection.atomic_blocks) == 1:
            # Outermost block: nothing has run yet in this transaction.
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["read_only_snapshot"])
        boundary = history if history is not None else live_boundary()
        if since is not None:
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["chains_since"], {"since": since, "chains": selected})
                selected = sorted(r[0] for r in cursor.fetchall())
        _check_rows(report, selected, boundary.starts)
        if selected is not None and since is None:
            # A chain asked for by name that has no rows at all was removed whole
            # (or never existed); either way it is not intact.
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["chains_present"], {"chains": selected})
                present = {r[0] for r in cursor.fetchall()}
            for chain in selected:
                if chain not in present:
                    report.add(
                        Problem(
                            kind="chain_missing",
                            message="no audit entries at all for this chain",
                            chain=chain,
                            job_id=_job_of(chain),
                        )
                    )
        genuine = _check_checkpoints(report)
        if selected is None:  # a full verification: the checkpoint log too
            _check_tree_heads(report, genuine)
        if boundary.detached or boundary.archived_heads is not None:
            boundary.check_heads(report, genuine, selected, since)
        else:
            _check_heads(report, genuine, selected, since)
        if selected is None:
            boundary.check_partitions(report)
        _check_expected(report, genuine, expected_checkpoints)
        for path in settings.AUDIT_VERIFY_CHECKS:
            import_string(path)(report, selected, requested=requested, since=since)
    report.seconds = time.perf_counter() - started
    return report


@dataclass(frozen=True)
class _Stream:
    """One chain range [low, high) read by its own server-side cursor; None: open end."""

    low: str | None = None
    high: str | None = None

    def params(self, selected: list[str] | None) -> dict[str, Any]:
        """The parameters of the verify_rows statement for this range of `selected`."""
        return {"chains": selected, "low": self.low, "high": self.high}


def _streams(selected: list[str] | None) -> list[_Stream]:
    """The chain ranges to read side by side: one, unless this is a full verification in
    its own transaction of a table over AUDIT_VERIFY_PARALLEL_MIN_ROWS rows.

    The ranges cut the chain histogram of the planner's statistics into equal parts, so
    each stream reads about as many rows (a table of few chains has their list of most
    common values instead); no chain is split, so each range is checked
    on its own exactly as the whole table would be. Without statistics: one stream.
    """
    wanted = settings.AUDIT_VERIFY_STREAMS
    if wanted < 2 or selected is not None or len(connection.atomic_blocks) != 1:
        return [_Stream()]
    with connection.cursor() as cursor:
        # Sorted by the server (the ranges compare in its collation, not Python's).
        cursor.execute(QUERIES["chain_statistics"])
        estimate, bounds = cursor.fetchone()
    if estimate < settings.AUDIT_VERIFY_PARALLEL_MIN_ROWS or not bounds:
        return [_Stream()]
    # In the server's order, without repeats: each range starts where the last ends.
    cuts = list(dict.fromkeys(bounds[len(bounds) * i // wanted] for i in range(1, wanted)))
    edges: list[str | None] = [None, *cuts, None]
    return [_Stream(low, high) for low, high in pairwise(edges)]


@contextmanager
def _snapshot_connection(params: dict[str, Any], snapshot: str) -> Iterator[Any]:
    """A new psycopg connection in a READ ONLY transaction on `snapshot`, so that a
    second stream sees exactly the history the verification's transaction sees."""
    raw = psycopg.connect(**params)
    try:
        raw.execute(QUERIES["begin_read_only"])
        raw.execute(pgsql.SQL(QUERIES["set_snapshot"]).format(snapshot=pgsql.Literal(snapshot)))
        yield raw
    finally:
        raw.close()


def _batches(
    streams: list[Any], selected: list[str] | None, sql: str | None = None
) -> Iterator[tuple[int, list[tuple[Any, ...]]]]:
    """Yield (stream index, batch of rows) from one server-side cursor per stream, each
    fetched by a helper thread.

    The threads wait on PostgreSQL (which builds the next batches, one backend per
    stream) while the caller hashes the current one, so every CPU core works; the
    bounded queue keeps at most a few batches in memory. The caller must not use the
    connection until this generator is exhausted or closed. `sql`: another statement
    than verify_rows, taking each stream's `params` (audit.incremental reads id ranges).
    """
    own = connection.connection  # the psycopg connection: named cursors need it
    snapshot, params = "", connection.get_connection_params()
    if len(streams) > 1:
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["export_snapshot"])
            snapshot = cursor.fetchone()[0]
    batches: queue.Queue[Any] = queue.Queue(maxsize=2 * len(streams))
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce(index: int, stream: Any) -> None:
        try:
            with ExitStack() as stack:
                # The first stream reads in the verification's own transaction.
                raw = stack.enter_context(_snapshot_connection(params, snapshot)) if index else own
                # binary: bytea arrives as raw bytes, with no hex step on either side.
                with raw.cursor(name=f"audit_verify_rows_{index}", binary=True) as cursor:
                    cursor.itersize = BATCH_ROWS
                    cursor.execute(sql or QUERIES["verify_rows"], stream.params(selected))
                    while batch := cursor.fetchmany(BATCH_ROWS):
                        if not put((index, batch)):
                            return
            put((index, None))
        except BaseException as exc:  # handed to the caller, which re-raises it
            put(exc)

    threads = [
        threading.Thread(target=produce, args=(i, s), name=f"audit-verify-{i}", daemon=True)
        for i, s in enumerate(streams)
    ]
    for thread in threads:
        thread.start()
    try:
        running = len(threads)
        while running:
            item = batches.get()
            if isinstance(item, BaseException):
                raise item
            if item[1] is None:
                running -= 1
            else:
                yield item
    finally:
        stop.set()
        for thread in threads:
            thread.join()


@dataclass
class _Walk:
    """Where one stream stands: its current chain, the seq and prev_hash the next row of
    that chain must have."""

    chain: str | None = None
    expected_seq: int = 1
    expected_prev: str = GENESIS_HASH


def _check_rows(
    report: VerificationReport,
    selected: list[str] | None,
    starts: dict[str, tuple[int, str]] | None = None,
) -> None:
    """Stream every chosen row once and check it against its predecessor.

    Per row: seq continues from 1; prev_hash is the previous row's chain_hash (the
    genesis hash for seq 1); sha256(prev_hash bytes + the exact stored payload
    bytes) equals chain_hash; and the payload's chain, seq, event_type, job_id,
    actor and ts agree with the columns. Suspect rows are examined again after the
    stream (the connection is busy during it) to say exactly what broke. A chain of
    `starts` begins at that seq and prev_hash (its older segments were detached).
    """
    starts = starts or {}
    if selected is not None and not selected:
        return
    streams = _streams(selected)
    report.streams = len(streams)
    walks = [_Walk() for _ in streams]
    sha256 = hashlib.sha256
    fromhex = bytes.fromhex
    rows = chains = 0
    suspects: list[tuple[Any, ...]] = []
    overflow = 0
    for index, batch in _batches(streams, selected):
        rows += len(batch)
        walk = walks[index]
        chain, expected_seq, expected_prev = walk.chain, walk.expected_seq, walk.expected_prev
        for row_chain, seq, payload, prev, stored, prefix, suffix in batch:
            if row_chain != chain:
                chain = row_chain
                chains += 1
                expected_seq, expected_prev = starts.get(row_chain, _FROM_GENESIS)
            try:
                hash_ok = sha256(fromhex(prev) + payload).hexdigest() == stored
            except ValueError:
                hash_ok = False
            if not (
                hash_ok
                and seq == expected_seq
                and prev == expected_prev
                and payload.startswith(prefix)
                and payload.endswith(suffix)
            ):
                if len(suspects) < MAX_PROBLEMS:
                    suspect = (row_chain, seq, payload, prev, stored, expected_seq, expected_prev)
                    suspects.append(suspect)
                else:
                    overflow += 1  # counted, not described
            expected_seq = seq + 1
            expected_prev = stored
        walk.chain, walk.expected_seq, walk.expected_prev = chain, expected_seq, expected_prev
    report.rows_checked += rows
    report.chains_checked += chains
    for suspect in sorted(suspects, key=lambda s: (s[0], s[1])):
        problem = _row_problem(*suspect)
        if problem is not None:
            report.add(problem)
    report.problems_total += overflow


_FROM_GENESIS = (1, GENESIS_HASH)


def _row_problem(
    chain: str,
    seq: int,
    payload: bytes,
    prev: str,
    stored: str,
    expected_seq: int,
    expected_prev: str,
) -> Problem | None:
    """Say everything that is wrong with one suspect row (None: it was a false alarm of
    the fast field check, e.g. a string that needed JSON escaping)."""
    broken = []
    if seq != expected_seq:
        broken.append(f"sequence gap: expected seq {expected_seq}, found {seq}")
    if prev != expected_prev:
        broken.append(
            f"prev_hash {prev} does not match the previous row's chain_hash {expected_prev}"
        )
    try:
        computed: str | None = hashlib.sha256(bytes.fromhex(prev) + payload).hexdigest()
    except ValueError:
        computed = None
    if computed != stored:
        broken.append(f"chain_hash {stored} does not match sha256(prev_hash + payload) {computed}")
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["row_detail"], {"chain": chain, "seq": seq})
        detail = cursor.fetchone()
    job_id = _job_of(chain)
    if detail is not None:
        job_id = detail[0] or job_id
        columns = {"chain": chain, "seq": seq, **dict(zip(_DETAIL_COLUMNS, detail, strict=False))}
        mismatch = _field_mismatch(payload.decode("utf-8", "replace"), columns)
        if mismatch:
            broken.append(mismatch)
    if not broken:
        return None
    return Problem(
        kind="row_broken", message="; ".join(broken), chain=chain, job_id=job_id, seq=seq
    )


# The columns of row_detail (audit/queries.sql) before the payload, by the names of
# audit.canonical.entry_payload.
_DETAIL_COLUMNS = ("job_id", "event_type", "actor_type", "actor_id", "ts")


def _field_mismatch(text: str, columns: dict[str, Any]) -> str | None:
    """Which of the payload's fields disagree with the row's `columns` (chain, seq and
    _DETAIL_COLUMNS; None: all agree)."""
    try:
        payload = json.loads(text)
    except ValueError:
        return "payload is not valid JSON"
    if not isinstance(payload, dict):
        return "payload is not a JSON object"
    expected = entry_payload(**columns, data=payload.get("data"))
    wrong = [k for k, v in expected.items() if k != "data" and payload.get(k, object()) != v]
    if not wrong:
        if set(payload) != set(expected) or canonical_bytes(payload) != text.encode():
            return "payload is not canonical JSON of the expected keys"
        return None
    return "payload disagrees with the row's columns on " + ", ".join(wrong)


def _check_checkpoints(report: VerificationReport) -> list[int]:
    """Verify the checkpoint chain; return the ids of the checkpoints that are genuine.

    For each, in id order: prev_hash links to the previous checkpoint (genesis for
    the first); sha256(prev_hash bytes + payload bytes) is checkpoint_hash; the key
    id is known and the HMAC verifies; and the columns checkpoint_write relies on
    (created_at, last_audit_id, key_id, prev_hash) agree with the signed payload.
    A payload names at most MAX_HEADS heads (about 0.6 MB), and few are fetched
    per round trip, so memory stays small.
    """
    genuine: list[int] = []
    expected_prev = GENESIS_HASH
    raw = connection.connection
    # binary: the payload arrives as raw bytes, not as twice as much hex text.
    with raw.cursor(name="audit_verify_checkpoints", binary=True) as cursor:
        cursor.itersize = 2
        cursor.execute(QUERIES["verify_checkpoints"])
        for row in cursor:
            report.checkpoints_checked += 1
            broken = checkpoint_problems(row[:8], expected_prev, heads=row[8])
            if broken:
                report.add(
                    Problem(
                        kind="checkpoint_broken", message="; ".join(broken), checkpoint_id=row[0]
                    )
                )
            else:
                genuine.append(row[0])
            expected_prev = row[3]
    return genuine


def _check_tree_heads(report: VerificationReport, genuine: list[int]) -> None:
    """The checkpoint log recomputed from the genuine checkpoints (audit.tree_check)."""
    checked, found = check_tree_heads(genuine, limit=MAX_PROBLEMS)
    report.tree_heads_checked += checked
    for kind, message, cp_id in found:
        report.add(Problem(kind=kind, message=message, checkpoint_id=cp_id))


def _check_heads(
    report: VerificationReport,
    genuine: list[int],
    selected: list[str] | None,
    since: datetime | None,
) -> None:
    """Every head a genuine checkpoint names must still exist with the same hash.

    Done in SQL (an index lookup per head on (chain, seq)) so that no checkpoint's
    heads are ever held in Python memory.
    """
    if not genuine:
        return
    params = {"genuine": genuine, "chains": selected, "since": since, "limit": MAX_PROBLEMS}
    with connection.cursor() as cursor:
        # One pass counts the heads and fetches the bad ones only.
        cursor.execute(QUERIES["verify_heads"], params)
        rows = cursor.fetchall()
    report.heads_checked += rows[0][0]
    for _, cp_id, chain, seq, head_hash, found in rows:
        if cp_id is None:
            continue  # every head is intact: the count's row alone
        if found is None:
            message = f"head seq {seq} recorded by the checkpoint is missing"
            kind = "head_missing"
        else:
            message = f"head seq {seq} has chain_hash {found}, the checkpoint recorded {head_hash}"
            kind = "head_changed"
        report.add(
            Problem(
                kind=kind,
                message=message,
                chain=chain,
                job_id=_job_of(chain),
                seq=seq,
                checkpoint_id=cp_id,
            )
        )


def _check_expected(
    report: VerificationReport, genuine: list[int], expected: Iterable[str]
) -> None:
    wanted = sorted({h.strip().lower() for h in expected if h and h.strip()})
    if not wanted:
        return
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["checkpoints_present"], {"genuine": genuine, "wanted": wanted})
        present = {row[0] for row in cursor.fetchall()}
    for digest in wanted:
        if digest not in present:
            report.add(
                Problem(
                    kind="checkpoint_missing",
                    message=(
                        f"exported checkpoint {digest} is not a genuine checkpoint in the "
                        "database: history after it was deleted or rewritten"
                    ),
                )
            )
