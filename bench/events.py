"""Benchmark: outbox relay throughput (DESIGN.md 3.8), one relay and two at once.

1. Create a scratch database (<test db>_bench_events) with Django's test machinery and
   fill `event_outbox` with 4 events per job for `--jobs` jobs, inserted round by round
   (event 1 of every job, then event 2, ...) as real transitions interleave.
2. Point the relay at a scratch topic exchange with one bound queue (same code path,
   same confirms and persistence; the real `events.jobs`/`erp.events` stay untouched).
3. Time `outbox_relay_once` draining everything with one relay, then again (fresh rows)
   with two relays in threads at once; read the queue back and count what is missing
   and any job whose events arrived out of seq order (both must be 0).
Prints one line per figure and writes bench/results/events.json.

Usage: python bench/events.py [--jobs 5000] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()

    import logging

    import django
    from django.conf import settings

    django.setup()

    logging.getLogger("jobs.events").setLevel(logging.WARNING)
    from django.db import connection
    from kombu import Connection, Exchange, Queue

    import jobs.events
    from jobs.models import EventOutbox

    old_name = connection.settings_dict["NAME"]
    connection.settings_dict["TEST"]["NAME"] = f"{old_name}_bench_events"
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    exchange = Exchange(f"bench.events.{uuid.uuid4().hex[:6]}", type="topic", durable=False)
    queue = Queue(f"bench.events.{uuid.uuid4().hex[:6]}", exchange=exchange, routing_key="#")
    jobs.events.EVENTS_EXCHANGE = exchange  # type: ignore[misc]
    results: dict[str, float | int] = {"jobs": args.jobs, "events": args.jobs * 4}
    try:
        with Connection(settings.BROKER_URL) as conn:
            channel = conn.channel()
            exchange(channel).declare()
            queue(channel).declare()

            for relays in (1, 2):
                job_ids = [uuid.uuid4() for _ in range(args.jobs)]
                rows = []
                for seq in range(1, 5):
                    for job_id in job_ids:
                        event_id = uuid.uuid4()
                        rows.append(
                            EventOutbox(
                                event_id=event_id,
                                job_id=job_id,
                                seq=seq,
                                payload={
                                    "event_id": str(event_id),
                                    "type": "job.status.changed",
                                    "job_id": str(job_id),
                                    "job_type": "sim",
                                    "seq": seq,
                                    "status": "queued",
                                    "previous_status": "pending",
                                    "progress": 0,
                                    "attempt": 0,
                                    "timestamp": "2026-01-01T00:00:00.000000Z",
                                },
                            )
                        )
                EventOutbox.objects.bulk_create(rows, batch_size=5000)

                def relay() -> None:
                    try:
                        while EventOutbox.objects.filter(published_at__isnull=True).exists():
                            jobs.events.outbox_relay_once(limit=5000)
                    finally:
                        connection.close()

                started = time.perf_counter()
                threads = [threading.Thread(target=relay) for _ in range(relays)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                elapsed = time.perf_counter() - started

                seen: dict[str, list[int]] = {}
                bound = queue(channel)
                while (message := bound.get(no_ack=True)) is not None:
                    body = json.loads(message.body)
                    seen.setdefault(body["job_id"], []).append(body["seq"])
                missing = sum(4 - len(set(seen.get(str(j), []))) for j in job_ids)
                out_of_order = sum(1 for seqs in seen.values() if seqs != sorted(seqs))
                key = f"relays_{relays}"
                results[f"{key}_events_per_s"] = round(len(rows) / elapsed, 1)
                results[f"{key}_seconds"] = round(elapsed, 2)
                results[f"{key}_missing"] = missing
                results[f"{key}_jobs_out_of_order"] = out_of_order
            queue(channel).delete()
            exchange(channel).delete()
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    for name, value in results.items():
        print(f"{name}: {value}")
    out = ROOT / "bench" / "results" / "events.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
