"""Benchmark: the outbox relay vs a raw batched confirmed publish (docs/architecture.md).

Scratch database and vhost `jobops_bench_events` with the real topology; a sink queue
bound to `events.jobs` receives what the relay publishes (as `erp.events` does where
an ERP is configured; the scratch settings configure none).

1. Fill `event_outbox` (COPY) with 4 events per job for --jobs jobs, round by round
   (event 1 of every job, then event 2, ...) as interleaved transitions write them.
   A warm-up batch goes first (imports, the relay's broker connection).
2. Baseline: the same payloads published raw to `events.jobs` (persistent,
   mandatory, one confirm wait per 1,000): the broker's floor for any relay.
3. One relay: `jobs.events.outbox_relay_once()` called until nothing is left
   unpublished, as the dispatcher's loop calls it; events/s (target >= 5,000).
4. Two relays at once (threads, own connections), fresh rows.
5. After each relay run the sink is read back: every event of every job must arrive
   (0 missing) and each job's events in seq order (0 out of order).
Writes bench/results/events.json.

Usage: python bench/events.py [--jobs 5000] [--quick] [--keep]
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common

NAME = "events"
# Sizes of `make bench`, and of --quick (seconds, for development).
FULL = {"jobs": 5000}
QUICK = {"jobs": 500}
EVENTS_PER_JOB = 4
EXCHANGE, ROUTING_KEY = "events.jobs", "job.status.changed"  # docs/architecture.md
SINK = "bench.events.sink"


def outbox_rows(jobs: int) -> list[tuple[str, str, int, str]]:
    """(event_id, job_id, seq, payload JSON), round by round."""
    job_ids = [str(uuid.uuid4()) for _ in range(jobs)]
    rows = []
    for seq in range(1, EVENTS_PER_JOB + 1):
        for job_id in job_ids:
            event_id = str(uuid.uuid4())
            payload = {
                "event_id": event_id,
                "type": "job.status.changed",
                "job_id": job_id,
                "job_type": "sim",
                "seq": seq,
                "status": "queued",
                "previous_status": "pending",
                "progress": 0,
                "attempt": 0,
                "timestamp": "2026-01-01T00:00:00.000000Z",
            }
            rows.append((event_id, job_id, seq, json.dumps(payload)))
    return rows


def fill_outbox(scratch: common.Scratch, rows: list[tuple[str, str, int, str]]) -> None:
    with scratch.connect(autocommit=False) as conn, conn.cursor() as cursor:
        with cursor.copy(
            "COPY event_outbox (event_id, job_id, seq, payload, created_at) FROM STDIN"
        ) as copy:
            for event_id, job_id, seq, payload in rows:
                copy.write_row((event_id, job_id, seq, payload, "now"))
        conn.commit()


def unpublished(scratch: common.Scratch) -> int:
    return int(scratch.scalar("SELECT count(*) FROM event_outbox WHERE published_at IS NULL"))


def relay(scratch: common.Scratch, relays: int) -> float:
    """Run `relays` relays in threads until nothing is unpublished; the seconds."""
    from django.db import connection

    import jobs.events

    errors: list[BaseException] = []

    def one() -> None:
        try:
            while unpublished(scratch):
                jobs.events.outbox_relay_once()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    with common.stopwatch() as timing:
        threads = [threading.Thread(target=one) for _ in range(relays)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return timing["seconds"]


def read_back(scratch: common.Scratch, rows: list[tuple[str, str, int, str]]) -> dict[str, int]:
    """Missing events, jobs whose events arrived out of seq order, duplicates."""
    arrived: dict[str, list[int]] = {}

    def handle(message: Any) -> None:
        body = json.loads(message.body)
        arrived.setdefault(body["job_id"], []).append(body["seq"])

    received = common.drain_queue(scratch.broker_url, SINK, handle)
    expected = {(job_id, seq) for _e, job_id, seq, _p in rows}
    seen = {(job_id, seq) for job_id, seqs in arrived.items() for seq in seqs}
    return {
        "received": received,
        "missing": len(expected - seen),
        "jobs_out_of_order": sum(1 for seqs in arrived.values() if seqs != sorted(seqs)),
        "duplicates": received - len(seen),
    }


def purge(scratch: common.Scratch, *queues: str) -> None:
    from kombu import Connection

    with Connection(scratch.broker_url) as conn:
        for queue in queues:
            conn.default_channel.queue_purge(queue)


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--jobs", type=int, help="jobs, 4 events each [5000]")
    args, report = common.prepare(NAME, parser, full=FULL, quick=QUICK)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        scratch.setup_django()
        from kombu import Connection

        with Connection(scratch.broker_url) as conn:
            channel = conn.default_channel
            channel.queue_declare(SINK, durable=True, auto_delete=False)
            channel.queue_bind(SINK, EXCHANGE, "#")
        events = args.jobs * EVENTS_PER_JOB

        rows = outbox_rows(args.jobs)
        raw_seconds = common.raw_confirmed_publish(
            scratch.broker_url,
            exchange=EXCHANGE,
            routing_key=ROUTING_KEY,
            bodies=[payload.encode() for *_, payload in rows],
        )
        raw_per_s = common.rate(events, raw_seconds)
        purge(scratch, SINK)

        # Warm-up: the relay's first call pays for imports and its broker connection.
        fill_outbox(scratch, outbox_rows(25))
        relay(scratch, 1)
        purge(scratch, SINK)

        results: dict[str, Any] = {"raw_publish": {"seconds": raw_seconds, "per_s": raw_per_s}}
        for relays in (1, 2):
            rows = outbox_rows(args.jobs)
            fill_outbox(scratch, rows)
            seconds = relay(scratch, relays)
            counts = read_back(scratch, rows)
            results[f"relays_{relays}"] = {
                "seconds": round(seconds, 3),
                "events_per_s": common.rate(events, seconds),
                **counts,
            }
        report.extra("detail", results)
        one, two = results["relays_1"], results["relays_2"]
        report.compare(
            "relay_vs_raw",
            label=f"outbox relay, 1 relay, {events} events",
            value=one["events_per_s"],
            unit="ev/s",
            baseline=raw_per_s,
            baseline_label="raw confirmed publish",
            absolute=5000,
        )
        report.compare(
            "two_relays_vs_one",
            label="outbox relay, 2 relays at once",
            value=two["events_per_s"],
            unit="ev/s",
            baseline=one["events_per_s"],
            baseline_label="1 relay",
        )
        for relays, result in ((1, one), (2, two)):
            report.check(
                f"relays_{relays}_complete",
                label=f"{relays} relay(s): 0 missing, 0 out of order",
                ok=result["missing"] == 0 and result["jobs_out_of_order"] == 0,
                detail=f"missing {result['missing']}, jobs out of order "
                f"{result['jobs_out_of_order']}, duplicates {result['duplicates']}",
            )
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
