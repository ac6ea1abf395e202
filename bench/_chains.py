"""Valid audit chains, generated fast and loaded with COPY (bench/audit.py, bench/scale.py).

Each job gets the 10 entries of a job that retried once and succeeded (EVENTS), hashed
exactly as docs/architecture.md says: `chain_hash = sha256(prev_hash + canonical JSON)`, RFC
8785 JSON, the first prev_hash 32 zero bytes. Payloads are written with an f-string
(a million rows a few seconds, where a JSON canonicaliser per row would take minutes);
`check_payload_form` proves, before any load, that the f-string gives the bytes
`rfc8785` gives and the same fields as a payload the app itself just wrote, so a
change in the app's payload stops the benchmark instead of loading broken chains.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

from audit.partitions import part_for_job
from bench._common import BenchError, Scratch

GENESIS = "0" * 64
EVENTS: list[tuple[str, str | None, str]] = [  # (event, from, to)
    ("created", None, "pending"),
    ("queued", "pending", "queued"),
    ("started", "queued", "running"),
    ("retrying", "running", "retrying"),
    ("queued", "retrying", "queued"),
    ("started", "queued", "running"),
    ("progress", "running", "running"),
    ("progress", "running", "running"),
    ("progress", "running", "running"),
    ("succeeded", "running", "succeeded"),
]
COLUMNS = "chain, job_id, seq, event_type, actor_type, actor_id, ts, payload, prev_hash, chain_hash"
START = datetime(2026, 1, 1, tzinfo=UTC)
# The job's context every job entry carries (jobs/sql: the payload's data.context).
CONTEXT = '{"correlation_id":null,"job_type":"sim","org_id":1,"project_id":null,"request_id":null}'


def payload_text(
    *, chain: str, seq: int, ts: str, event: str, job: str, src: str | None, dst: str, attempt: int
) -> str:
    """The canonical (RFC 8785) payload of a system-made entry: keys sorted, no spaces."""
    src_json = "null" if src is None else f'"{src}"'
    return (
        f'{{"actor":{{"id":"jobops","type":"system"}},"chain":"{chain}",'
        f'"data":{{"attempt":{attempt},"context":{CONTEXT},"from":{src_json},"to":"{dst}"}},'
        f'"event_type":"{event}","job_id":"{job}","seq":{seq},"ts":"{ts}"}}'
    )


def _shape(value: Any) -> Any:
    """The keys of a JSON document, recursively (values left out)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return type(value).__name__ if value is not None else "null"


def check_payload_form(scratch: Scratch) -> None:
    """Fail unless generated payloads are canonical and shaped like the app's own.

    Needs Django loaded (`Scratch.setup_django`): it creates one job with `job_create`
    and reads its `created` entry back from `audit_logs`.
    """
    import rfc8785

    from bench._jobflow import bench_user
    from jobs.services import job_create

    job, _ = job_create(owner=bench_user("bench-chains"), job_type="ai", params={"text": "x"})
    real_text = scratch.scalar(
        "SELECT payload FROM audit_logs WHERE job_id = %s AND seq = 1", [job.id]
    )
    real = json.loads(real_text)
    job_id = str(uuid.uuid4())
    mine_text = payload_text(
        chain=f"job:{job_id}",
        seq=1,
        ts="2026-01-01T00:00:00.000001Z",
        event="created",
        job=job_id,
        src=None,
        dst="pending",
        attempt=0,
    )
    mine = json.loads(mine_text)
    if rfc8785.dumps(mine) != mine_text.encode():
        raise BenchError(f"bench/_chains.py payload is not RFC 8785: {mine_text}")
    real["actor"]["type"] = mine["actor"]["type"]  # a user made the real one
    if _shape(real) != _shape(mine):
        raise BenchError(
            "the app's audit payload changed; update bench/_chains.py payload_text:\n"
            f"  app:   {real_text}\n  bench: {mine_text}"
        )


def chain_lines(
    job_ids: list[str],
    *,
    per_job: int,
    by_chain: bool,
    heads: dict[str, bytes],
    start: datetime = START,
    tick_us: int = 37,
    part: date | None = None,
) -> Iterator[str]:
    """COPY text lines of valid chains for `job_ids`, `per_job` entries each.

    `by_chain` False: round by round (entry 1 of every job, then entry 2, ...), so a
    chain's rows are spread over the table as interleaved jobs leave them; True: chain
    after chain, which (with sorted ids) appends to every index instead of inserting
    at random, for loads of tens of millions of rows. `heads` ends up holding each
    chain's last hash. Entry n is at `start` + n * `tick_us` microseconds; with `part`
    each line ends with it (the partitioned log's column: a job chain's month).
    """
    tail = "\n" if part is None else f"\t{part.isoformat()}\n"
    heads.update(dict.fromkeys(job_ids, bytes(32)))
    tick = 0

    def line(job: str, r: int) -> str:
        nonlocal tick
        tick += 1
        event, src, dst = EVENTS[r % len(EVENTS)]
        ts = (start + timedelta(microseconds=tick * tick_us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        chain = f"job:{job}"
        text = payload_text(
            chain=chain, seq=r + 1, ts=ts, event=event, job=job, src=src, dst=dst, attempt=r // 4
        )
        prev = heads[job]
        digest = hashlib.sha256(prev + text.encode()).digest()
        heads[job] = digest
        # COPY text format: none of these values holds a tab, newline or backslash.
        return (
            f"{chain}\t{job}\t{r + 1}\t{event}\tsystem\tjobops\t{ts}\t{text}\t"
            f"{prev.hex()}\t{digest.hex()}{tail}"
        )

    if by_chain:
        for job in job_ids:
            yield "".join(line(job, r) for r in range(per_job))
    else:
        for r in range(per_job):
            for first in range(0, len(job_ids), 10_000):
                yield "".join(line(job, r) for job in job_ids[first : first + 10_000])


def copy_chains(
    conn: Any,
    job_ids: list[str],
    *,
    per_job: int,
    by_chain: bool,
    start: datetime = START,
    tick_us: int = 37,
    part: date | None = None,
) -> dict[str, str]:
    """COPY the chains into audit_logs on `conn` (the caller commits); returns each
    job's chain head (hex), which a job row that keeps its head must carry.

    On the partitioned log (audit.partitions) every entry names its partition: `part`,
    by default the current UTC month's job partition (the month of a job created now);
    before migration audit 0010 (no `part` column) none is written."""
    if part is None and _has_part(conn):
        part = part_for_job(datetime.now(UTC))
    columns = COLUMNS if part is None else f"{COLUMNS}, part"
    heads: dict[str, bytes] = {}
    lines = chain_lines(
        job_ids,
        per_job=per_job,
        by_chain=by_chain,
        heads=heads,
        start=start,
        tick_us=tick_us,
        part=part,
    )
    with conn.cursor() as cursor, cursor.copy(f"COPY audit_logs ({columns}) FROM STDIN") as copy:
        batch: list[str] = []
        for chunk in lines:
            batch.append(chunk)
            if len(batch) >= 1000:
                copy.write("".join(batch))
                batch = []
        if batch:
            copy.write("".join(batch))
    return {job: digest.hex() for job, digest in heads.items()}


def _has_part(conn: Any) -> bool:
    return bool(
        conn.execute(
            "SELECT EXISTS (SELECT FROM information_schema.columns WHERE table_name = "
            "'audit_logs' AND column_name = 'part' AND table_schema = current_schema())"
        ).fetchone()[0]
    )
