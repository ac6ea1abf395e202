"""Jobs through the public doors: create with the service, count with SQL.

Creation goes through `jobs.services.job_create` (in this process, Django loaded by
`Scratch.setup_django`); everything a benchmark reads back it reads with plain SQL on
the tables of docs/architecture.md (`jobs`, `audit_logs`, `dead_letters`), so that
benchmarks keep working while the app's models and modules move.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from bench._common import (
    BenchError,
    CpuSampler,
    Scratch,
    Service,
    rate,
    start_worker,
    stopwatch,
    wait_until,
)


def bench_user(username: str, *, superuser: bool = False) -> Any:
    """A user of the scratch database (Django's auth API, not the app's)."""
    from django.contrib.auth import get_user_model

    model = get_user_model()
    user = model.objects.filter(username=username).first()
    if user is None:
        make = model.objects.create_superuser if superuser else model.objects.create_user
        user = make(username=username, email=f"{username}@bench.invalid", password=None)
    from tenants.models import DEFAULT_ORG_SLUG, Membership, Organisation

    org, _ = Organisation.objects.get_or_create(slug=DEFAULT_ORG_SLUG, defaults={"name": "Default"})
    Membership.objects.get_or_create(user=user, organisation=org)
    return user


def user_token(user: Any) -> str:
    """A DRF token for `user` (the API's token authentication)."""
    from rest_framework.authtoken.models import Token

    token, _ = Token.objects.get_or_create(user=user)
    return str(token.key)


def create_jobs(
    n: int,
    *,
    owner: Any,
    job_type: str = "ai",
    params: dict[str, Any] | None = None,
    threads: int = 1,
) -> tuple[list[str], float]:
    """Create `n` jobs with `job_create`; returns (ids, seconds).

    With several threads (each with its own database connection) the benchmark's
    setup goes faster; figures that are a creation rate use one thread, as one API
    worker creates one job at a time.
    """
    from django.db import connection

    from jobs.services import job_create

    params = params if params is not None else {"text": "x"}
    ids: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def make(count: int) -> None:
        mine = []
        try:
            for _ in range(count):
                job, _created = job_create(owner=owner, job_type=job_type, params=params)
                mine.append(str(job.id))
        except BaseException as exc:  # reported below, in the calling thread
            errors.append(exc)
        finally:
            if threading.current_thread() is not threading.main_thread():
                connection.close()
            with lock:
                ids.extend(mine)

    started = time.perf_counter()
    if threads <= 1:
        make(n)
    else:
        shares = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]
        workers = [threading.Thread(target=make, args=(share,)) for share in shares]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    seconds = time.perf_counter() - started
    if errors:
        raise BenchError(f"job_create failed: {errors[0]!r}") from errors[0]
    return ids, seconds


def dispatcher_step(name: str) -> Any:
    """Run the dispatcher's own loop step `name` once (`dispatch_once`); its result.

    Steps are looked up by name in the loop's list (settings.JOBOPS_DISPATCHER_STEPS,
    or jobs.dispatcher.STEPS in older code), not imported from their modules, which
    move: the same benchmark then runs before and after a refactoring.
    """
    from django.conf import settings

    from jobs.dispatcher import dispatch_once

    steps = getattr(settings, "JOBOPS_DISPATCHER_STEPS", None)
    if steps is None:
        from jobs import dispatcher

        steps = dispatcher.STEPS  # type: ignore[attr-defined]
    step = next((s for s in steps if s[0] == name), None)
    if step is None:
        raise BenchError(f"the dispatcher has no step {name!r}: {[s[0] for s in steps]}")
    result = dispatch_once(steps=[step])[name]
    if isinstance(result, dict) and "error" in result:
        raise BenchError(f"dispatcher step {name} failed: {result['error']}")
    return result


def job_to_clone(conn: Any, *, none_because: str) -> tuple[Any, list[str]]:
    """The oldest succeeded job's id and the `jobs` table's columns in table order: what
    a benchmark clones finished jobs from with one INSERT ... SELECT (so that the
    clones follow the table as migrations change it). BenchError when no job has
    finished yet, saying `none_because`."""
    template = conn.execute(
        "SELECT id FROM jobs WHERE status = 'succeeded' ORDER BY created_at LIMIT 1"
    ).fetchone()
    if template is None:
        raise BenchError(f"no finished job to clone ({none_because})")
    columns = [
        row[0]
        for row in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'jobs' AND table_schema = current_schema() "
            "ORDER BY ordinal_position"
        )
    ]
    return template[0], columns


def status_counts(scratch: Scratch, job_ids: Iterable[str] | None = None) -> dict[str, int]:
    sql = "SELECT status, count(*) FROM jobs"
    params: list[Any] = []
    if job_ids is not None:
        sql += " WHERE id = ANY(%s::uuid[])"
        params.append(list(job_ids))
    with scratch.connect() as conn:
        rows = conn.execute(sql + " GROUP BY status", params).fetchall()
    return {status: int(count) for status, count in rows}


def wait_for_status(
    scratch: Scratch,
    *,
    count: int,
    statuses: tuple[str, ...],
    job_ids: list[str] | None = None,
    timeout: float,
    what: str,
    watch: list[Any] | None = None,
) -> None:
    """Wait until `count` jobs (of `job_ids`, or all) are in one of `statuses`.

    `watch`: services that must stay alive meanwhile (a crashed worker fails fast
    instead of after the timeout).
    """

    def done() -> bool:
        for service in watch or []:
            service.check_alive()
        counts = status_counts(scratch, job_ids)
        return sum(counts.get(s, 0) for s in statuses) >= count

    wait_until(done, timeout=timeout, what=what, interval=0.25)


def wait_then_stop(
    scratch: Scratch, worker: Any, *, job_ids: list[str], status: str, timeout: float, what: str
) -> None:
    """Wait until every job of `job_ids` is `status` while `worker` stays alive; stop it."""
    try:
        wait_for_status(
            scratch,
            count=len(job_ids),
            statuses=(status,),
            job_ids=job_ids,
            timeout=timeout,
            what=what,
            watch=[worker],
        )
    finally:
        worker.stop()


def audit_times(
    scratch: Scratch, *, events: tuple[str, ...], job_ids: list[str] | None = None
) -> dict[str, dict[str, float]]:
    """{event: {job_id: epoch seconds}} from the audit trail (first entry per job)."""
    sql = (
        "SELECT event_type, job_id::text, min(extract(epoch FROM ts))::float8 FROM audit_logs "
        "WHERE event_type = ANY(%s)"
    )
    params: list[Any] = [list(events)]
    if job_ids is not None:
        sql += " AND job_id = ANY(%s::uuid[])"
        params.append(job_ids)
    out: dict[str, dict[str, float]] = {event: {} for event in events}
    with scratch.connect() as conn:
        for event, job_id, ts in conn.execute(sql + " GROUP BY 1, 2", params):
            out[event][job_id] = float(ts)
    return out


def created_times(scratch: Scratch, job_ids: list[str]) -> dict[str, float]:
    with scratch.connect() as conn:
        rows = conn.execute(
            "SELECT id::text, extract(epoch FROM created_at)::float8 FROM jobs "
            "WHERE id = ANY(%s::uuid[])",
            [job_ids],
        ).fetchall()
    return {job_id: float(ts) for job_id, ts in rows}


def drain_rate(scratch: Scratch, job_ids: list[str]) -> dict[str, float]:
    """Jobs/s from the first `started` to the last `succeeded` of these jobs."""
    times = audit_times(scratch, events=("started", "succeeded"), job_ids=job_ids)
    started, done = times["started"], times["succeeded"]
    if len(done) < len(job_ids):
        raise BenchError(f"only {len(done)} of {len(job_ids)} jobs succeeded")
    first, last = min(started.values()), max(done.values())
    return {
        "jobs": len(job_ids),
        "seconds": round(last - first, 3),
        "jobs_per_s": rate(len(job_ids), last - first),
        "first_started_at": first,
        "last_succeeded_at": last,
    }


def start_times(scratch: Scratch, job_ids: list[str]) -> tuple[list[float], list[float]]:
    """Submit -> start and submit -> done in ms per job (created_at to audit entries)."""
    created = created_times(scratch, job_ids)
    times = audit_times(scratch, events=("started", "succeeded"), job_ids=job_ids)
    to_start = [(times["started"][j] - created[j]) * 1000 for j in job_ids]
    to_done = [(times["succeeded"][j] - created[j]) * 1000 for j in job_ids]
    return to_start, to_done


def create_and_drain(
    scratch: Scratch,
    *,
    bench: str,
    env: dict[str, str],
    jobs: int,
    owner: Any,
    queue: str = "default",
    concurrency: int = 2,
    prefetch: int = 3,
    dispatchers: dict[str, Service] | None = None,
) -> dict[str, Any]:
    """Creation rate, then drain rate, of `jobs` no-op `ai` jobs; the dispatcher must
    be running (it publishes whatever the creating process leaves pending).

    1. Create them with `job_create`, one at a time (jobs/s of creation).
    2. Wait until none is `pending` (published and confirmed), so the drain that
       follows measures the workers, not the publishing.
    3. Start a worker, wait until all succeeded; jobs/s from the first `started` to
       the last `succeeded` (audit trail), the worker's peak memory, and the CPU ms
       per job that each process spent in that window (worker, the `dispatchers`
       given, PostgreSQL, RabbitMQ, Redis).
    """
    ids, create_seconds = create_jobs(jobs, owner=owner)
    with stopwatch() as published:
        wait_for_status(
            scratch,
            count=len(ids),
            statuses=("queued",),
            job_ids=ids,
            timeout=600,
            what="every job to be published (queued)",
        )
    worker = start_worker(
        bench=bench, env=env, queues=queue, concurrency=concurrency, prefetch=prefetch
    )
    roles = {"worker": worker, **(dispatchers or {})}
    with CpuSampler(roles, database=scratch.database) as cpu:
        # At least a job a second, or something is stuck (a message routed elsewhere).
        wait_then_stop(
            scratch,
            worker,
            job_ids=ids,
            status="succeeded",
            timeout=max(300, jobs),
            what="the jobs",
        )
    drain = drain_rate(scratch, ids)
    return {
        "create_seconds": round(create_seconds, 3),
        "create_per_s": rate(len(ids), create_seconds),
        "publish_wait_after_create_seconds": round(published["seconds"], 3),
        **drain,
        "cpu_ms_per_job": cpu.ms_per_item(
            drain["first_started_at"], drain["last_succeeded_at"], len(ids)
        ),
        "peak_worker_rss_bytes": worker.peak_rss,
        "peak_worker_pss_bytes": worker.peak_pss,
    }
