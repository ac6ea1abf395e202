"""Benchmark: replay 10,000 dead letters and count what was lost (docs/benchmarks.md).

Scratch database and vhost `jobops_bench_dlq_replay` with the real topology.

1. Setup as the broker makes dead letters: N `ai` jobs created with `job_create` and
   published (the dispatcher's `publish` step); then their messages are rejected
   without requeue, as a consumer that gives up on them would, so that the broker
   puts a copy of each in `default_dlq` and `dlq.watch`. (Worker-made dead letters
   replay the same way; making 10,000 through a worker's failure path took 8 of the
   20 minutes this benchmark took.)
2. The watcher: the dispatcher's `dlq_watch` step (`dispatch_once`) until every job
   is `failed` with an open dead letter (reason `rejected`, broker copy recorded);
   messages/s.
3. Baseline: N messages of a job message's size published raw to `jobs.direct` ->
   `default` with one confirm wait per 1,000 (the broker's floor for putting N jobs
   back in their queue), then purged.
4. A dry run, then `dead_letters_replay(queue="default_dlq")` (failed -> pending,
   audited, rows `replayed`, broker copies acked away), then the dispatcher's
   `publish` step until no job is pending: msgs/s for the replay
   call and for replay + publish, i.e. until the jobs are back in their queue
   (target >= 2,000 msgs/s).
5. Counts: every replayed job `queued` with exactly one message in `default` (lost,
   duplicated), no copy left in `default_dlq`, every row `replayed`.
Writes bench/results/dlq_replay.json.

Usage: python bench/dlq_replay.py [--jobs 10000] [--quick] [--keep]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench._jobflow import (
    bench_user,
    create_jobs,
    dispatcher_step,
    status_counts,
)

NAME = "dlq_replay"
# Sizes of `make bench`, and of --quick (seconds, for development).
FULL = {"jobs": 10_000}
QUICK = {"jobs": 300}
JOB_TYPE, QUEUE, DLQ, WATCH = "ai", "default", "default_dlq", "dlq.watch"


def publish_pending(scratch: common.Scratch, *, timeout: float) -> int:
    """The dispatcher's publish step, in this process, until no job is pending."""
    published = 0

    def done() -> bool:
        nonlocal published
        published += int(dispatcher_step("publish") or 0)
        return status_counts(scratch).get("pending", 0) == 0

    common.wait_until(done, timeout=timeout, what="every pending job to be published", interval=0)
    return published


def broker_copies(scratch: common.Scratch) -> int:
    return int(scratch.scalar("SELECT count(*) FROM dead_letters WHERE broker_copy"))


def reject_all(scratch: common.Scratch, queue: str, count: int) -> None:
    """Take `count` messages from `queue` and reject them without requeue, as a consumer
    that gives up on them would: the broker dead-letters each to `<q>_dlq` and
    `dlq.watch`."""
    from kombu import Connection

    rejected = [0]
    with Connection(scratch.broker_url, connect_timeout=10) as conn:
        channel = conn.channel()
        channel.basic_qos(0, 500, False)

        def on_message(message: Any) -> None:
            channel.basic_reject(message.delivery_tag, requeue=False)
            rejected[0] += 1

        channel.basic_consume(queue, callback=on_message)
        while rejected[0] < count:
            conn.drain_events(timeout=60)
        channel.close()


def make_dead_letters(scratch: common.Scratch, jobs: int) -> dict[str, float]:
    """Step 1: N published jobs whose messages the broker dead-letters."""
    owner = bench_user("bench-dlq")
    ids, create_seconds = create_jobs(jobs, owner=owner, job_type=JOB_TYPE, threads=4)
    with common.stopwatch() as publishing:
        publish_pending(scratch, timeout=1800)
    reject_all(scratch, QUEUE, len(ids))
    common.wait_until(
        lambda: common.queue_depth(scratch.broker_url, WATCH) >= jobs,
        timeout=120,
        what=f"{jobs} dead letters in {WATCH}",
    )
    return {
        "create_seconds": round(create_seconds, 2),
        "publish_seconds": round(publishing["seconds"], 2),
    }


def watch(scratch: common.Scratch, jobs: int) -> dict[str, float]:
    """Step 2: the watcher fails each job with its dead letter, broker copy recorded."""

    def recorded() -> bool:
        dispatcher_step("dlq_watch")
        return broker_copies(scratch) >= jobs

    with common.stopwatch() as timing:
        common.wait_until(
            recorded,
            timeout=3600,
            what="the watcher to record every broker copy",
            interval=0,
        )
    return {
        "seconds": round(timing["seconds"], 2),
        "msgs_per_s": common.rate(jobs, timing["seconds"]),
    }


def count_losses(scratch: common.Scratch, jobs: int) -> dict[str, int]:
    """Step 5: what came back into `default`, once each, and what stayed behind."""
    seen: Counter[str] = Counter()

    def handle(message: Any) -> None:
        body = json.loads(message.body)
        seen[body[0][0]["job_id"]] += 1  # Celery protocol 2: [[payload], {}, {...}]

    common.drain_queue(scratch.broker_url, QUEUE, handle)
    with scratch.connect() as conn:
        replayed = {
            str(row[0])
            for row in conn.execute("SELECT job_id FROM dead_letters WHERE state = 'replayed'")
        }
        queued = {
            str(row[0]) for row in conn.execute("SELECT id FROM jobs WHERE status = 'queued'")
        }
        rows_not_replayed = conn.execute(
            "SELECT count(*) FROM dead_letters WHERE state <> 'replayed'"
        ).fetchone()[0]
    return {
        "replayed_rows": len(replayed),
        "lost": len(replayed - set(seen)) + len(replayed - queued),
        "duplicated": sum(1 for n in seen.values() if n > 1),
        "unexpected_messages": len(set(seen) - replayed),
        "rows_not_replayed": int(rows_not_replayed),
        "dlq_left": common.queue_depth(scratch.broker_url, DLQ),
    }


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--jobs", type=int, help="dead letters replayed [10000]")
    args, report = common.prepare(NAME, parser, full=FULL, quick=QUICK)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        # Publish pending jobs at once (the dispatcher's default waits 5 s for the
        # request's own publish, a wait that only slows this setup down).
        scratch.setup_django(JOBOPS_DISPATCH_PENDING_AFTER_SECONDS="0")
        detail: dict[str, Any] = {"setup": make_dead_letters(scratch, args.jobs)}
        detail["watcher"] = watch(scratch, args.jobs)
        # Baseline into the very queue the replayed jobs go back to (a quorum queue),
        # emptied again before the replay.
        raw_seconds = common.raw_confirmed_publish(
            scratch.broker_url,
            exchange="jobs.direct",
            routing_key=QUEUE,
            bodies=[b'{"job": "' + b"x" * 700 + b'"}'] * args.jobs,
        )
        raw_per_s = common.rate(args.jobs, raw_seconds)
        purge_queue(scratch, QUEUE)

        from dlq.services.replay import dead_letters_replay

        actor = bench_user("bench-dlq-operator", superuser=True)
        with common.stopwatch() as dry:
            preview = dead_letters_replay(
                actor_user=actor, justification="benchmark", queue=DLQ, dry_run=True
            )
        with common.stopwatch() as replay:
            result = dead_letters_replay(actor_user=actor, justification="benchmark", queue=DLQ)
        with common.stopwatch() as publish:
            publish_pending(scratch, timeout=3600)
        total = replay["seconds"] + publish["seconds"]
        detail["replay"] = {
            "dry_run_matched": getattr(preview, "matched", None),
            "dry_run_seconds": round(dry["seconds"], 3),
            "replay_seconds": round(replay["seconds"], 2),
            "replay_phases": getattr(result, "seconds", {}),
            "broker_copies_acked": getattr(result, "broker_acked", None),
            "publish_seconds": round(publish["seconds"], 2),
        }
        counts = count_losses(scratch, args.jobs)
        detail["counts"] = counts
        report.extra("detail", detail)

        report.figure(
            "watcher_msgs_per_s", detail["watcher"]["msgs_per_s"], "msgs/s", "watcher (dlq.watch)"
        )
        report.figure("dry_run_ms", round(dry["seconds"] * 1000, 1), "ms", "replay dry run")
        report.compare(
            "replay_call",
            label=f"dead_letters_replay, {args.jobs}",
            value=common.rate(args.jobs, replay["seconds"]),
            unit="msgs/s",
            baseline=raw_per_s,
            baseline_label="raw confirmed publish",
            absolute=2000,
        )
        report.compare(
            "replay_to_queue",
            label="replay + publish (back in queue)",
            value=common.rate(args.jobs, total),
            unit="msgs/s",
            baseline=raw_per_s,
            baseline_label="raw confirmed publish",
            absolute=2000,
        )
        report.check(
            "replayed_all",
            label=f"{args.jobs} replayed, none left in {DLQ}",
            ok=counts["replayed_rows"] == args.jobs
            and counts["rows_not_replayed"] == 0
            and counts["dlq_left"] == 0,
            detail=f"rows replayed {counts['replayed_rows']}, not replayed "
            f"{counts['rows_not_replayed']}, left in {DLQ} {counts['dlq_left']}",
        )
        report.check(
            "lost_duplicated",
            label="0 lost, 0 duplicated",
            ok=counts["lost"] == 0 and counts["duplicated"] == 0,
            detail=f"lost {counts['lost']}, duplicated {counts['duplicated']}, "
            f"unexpected {counts['unexpected_messages']}",
        )
        report.write(scratch)
    return 1 if report.failed else 0


def purge_queue(scratch: common.Scratch, queue: str) -> None:
    from kombu import Connection

    with Connection(scratch.broker_url) as conn:
        conn.default_channel.queue_purge(queue)


if __name__ == "__main__":
    sys.exit(main())
