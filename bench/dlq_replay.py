"""Benchmark: replay 10,000 dead letters and count what was lost (DESIGN.md 10).

1. Re-create a scratch database (jobops_bench_dlq on the server of DATABASE_URL) and
   migrate it; declare the topology in the vhost of BROKER_URL. The queues it uses
   (`sim`, `sim_dlq`, `dlq.watch`) must be empty, or pass --purge: use a scratch vhost
   (e.g. BROKER_URL=amqp://guest:guest@127.0.0.1:5672/bench) rather than a live one.
2. Make N failed `sim` jobs with open worker-made dead letters, exactly as a worker
   leaves them: the job's Celery message published (confirms), taken from `sim` and
   rejected without requeue, so the broker copies sit in `sim_dlq` and `dlq.watch`.
3. Time the watcher reconciling the N watch messages (broker copy marked, audited).
4. Time a dry run, then `dead_letters_replay(queue="sim_dlq")`: N transactions
   (failed -> pending, audited) and one ack-away pass over the DLQ; then the
   dispatcher's publish step (confirmed publish + `queued` per job) separately.
5. Count losses: every replayed job must be `queued` with exactly one message in `sim`,
   its row `replayed`, and no copy left in `sim_dlq`.
Prints one line per figure and writes bench/results/dlq_replay.json.

Usage: python bench/dlq_replay.py [--jobs 10000] [--purge]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DB_NAME = "jobops_bench_dlq"
QUEUES = ("sim", "sim_dlq", "dlq.watch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--purge", action="store_true", help="empty sim, sim_dlq, dlq.watch")
    args = parser.parse_args()

    url = scratch_database()
    manage(url, "migrate", "--noinput")
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    manage(url, "setup_topology")
    run(jobs=args.jobs, purge=args.purge)


def scratch_database() -> str:
    """Drop and create DB_NAME on the server of DATABASE_URL; return its URL."""
    import dj_database_url
    import psycopg

    base = dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jobops")
    )
    auth = base["USER"] + (f":{base['PASSWORD']}" if base.get("PASSWORD") else "")
    server = f"postgres://{auth}@{base['HOST'] or '127.0.0.1'}:{base['PORT'] or 5432}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    return f"{server}/{DB_NAME}"


def manage(url: str, *args: str) -> None:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings"}
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )


def run(*, jobs: int, purge: bool) -> None:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from kombu import Connection

    from audit.services import Actor
    from dlq.services import dead_letters_replay, job_fail_with_dead_letter
    from dlq.watcher import watch_once
    from jobs.models import DeadLetter, Job
    from jobs.services import Fence, job_claim, job_create, job_publish, publish_due_once
    from jobs.states import Status

    figures: dict[str, float | int | str] = {"jobs": jobs}
    conn = Connection(settings.BROKER_URL)
    channel = conn.channel()
    depths = {q: channel.queue_declare(queue=q, passive=True)[1] for q in QUEUES}
    if any(depths.values()):
        if not purge:
            sys.exit(f"queues not empty {depths}; use a scratch vhost or --purge")
        for q in QUEUES:
            channel.queue_purge(q)

    owner = get_user_model().objects.create_user("bench-dlq", is_staff=True)
    worker = Actor.system("worker")
    started = time.perf_counter()
    for i in range(jobs):
        job, _ = job_create(
            owner=owner, job_type="sim", params={"steps": 1, "step_seconds": 0}, actor=worker
        )
        # job_create published it on commit (confirmed -> queued); a failed publish
        # would leave it pending: publish it now then.
        job_publish(job_id=job.id, sources=(Status.PENDING,))
        claimed = job_claim(job_id=job.id, locked_by="bench")
        job_fail_with_dead_letter(
            job_id=job.id,
            reason="nonretryable",
            error_code=f"BENCH_{i % 3}",
            error_message="planned",
            actor=worker,
            fence=Fence("bench", claimed.attempts),
        )
    # Take every message from `sim` and reject it: the broker makes the copies.
    while (message := channel.basic_get(queue="sim", no_ack=False)) is not None:
        channel.basic_reject(message.delivery_tag, requeue=False)
    deadline = time.monotonic() + 60
    while channel.queue_declare(queue="dlq.watch", passive=True)[1] < jobs:
        if time.monotonic() > deadline:
            sys.exit("dead letters did not all reach dlq.watch")
        time.sleep(0.05)
    figures["setup_seconds"] = round(time.perf_counter() - started, 2)

    started = time.perf_counter()
    watched = 0
    while watched < jobs:
        done = watch_once(limit=jobs, timeout=600)
        if not done:
            break
        watched += done
    seconds = time.perf_counter() - started
    figures["watcher_msgs"] = watched
    figures["watcher_msgs_per_s"] = round(watched / seconds, 1)

    started = time.perf_counter()
    dry = dead_letters_replay(
        actor_user=owner, justification="bench", queue="sim_dlq", dry_run=True
    )
    figures["dry_run_matched"] = dry.matched
    figures["dry_run_ms"] = round((time.perf_counter() - started) * 1000, 1)

    started = time.perf_counter()
    result = dead_letters_replay(actor_user=owner, justification="bench", queue="sim_dlq")
    seconds = time.perf_counter() - started
    figures["replay_seconds"] = round(seconds, 2)
    figures["replay_msgs_per_s"] = round(len(result.resolved) / seconds, 1)
    figures["replayed"] = len(result.resolved)
    figures["broker_copies_acked"] = result.broker_acked
    for phase, phase_seconds in result.seconds.items():
        figures[f"replay_{phase}_seconds"] = phase_seconds

    # The dispatcher's publish step: every replayed job published and `queued`.
    started = time.perf_counter()
    published = 0
    while published < len(result.resolved):
        done = publish_due_once(limit=1000)
        if not done:
            break
        published += done
    seconds = time.perf_counter() - started
    figures["dispatcher_published"] = published
    figures["dispatcher_publish_per_s"] = round(published / seconds, 1) if seconds else 0

    # Losses: each replayed job queued once in `sim`, no copy left in `sim_dlq`.
    seen: dict[str, int] = {}
    while (message := channel.basic_get(queue="sim", no_ack=True)) is not None:
        job_id = json.loads(message.body)[0][0]["job_id"]
        seen[job_id] = seen.get(job_id, 0) + 1
    replayed_ids = set(result.job_ids)
    queued = set(
        str(j) for j in Job.objects.filter(status=Status.QUEUED).values_list("id", flat=True)
    )
    figures["lost"] = len(replayed_ids - set(seen)) + len(replayed_ids - queued)
    figures["duplicated"] = sum(1 for n in seen.values() if n > 1)
    figures["rows_not_replayed"] = DeadLetter.objects.exclude(state="replayed").count()
    figures["dlq_left"] = channel.queue_declare(queue="sim_dlq", passive=True)[1]
    conn.release()

    for name, value in figures.items():
        print(f"{name}: {value}")
    out = ROOT / "bench" / "results" / "dlq_replay.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
