"""Retention and purge (docs/operations/retention.md): ended jobs go once their retention
has passed, with their artefacts, closed dead letters and published outbox rows; their
audit chains stay, each closed by a `purged` entry.

A batch is one transaction: lock up to JOBOPS_PURGE_BATCH due jobs (`purge_claim`,
`FOR UPDATE SKIP LOCKED`: two dispatchers purge different jobs), append each one's
`purged` entry through jobs_note (jobs/sql/20_transitions.sql, as every job entry),
then delete the rows (`purge_delete`). The artefacts' files and objects are deleted
after commit: a rollback never leaves a row without its file, and a delete that fails
leaves an orphan that `artefact_orphans_sweep` removes later.

The audit tables are never touched but for the append: verify_audit_chain treats a
chain ending in `purged` as complete without its job row (jobs/selectors/audit_checks.py).

Every foreign key into a table purge deletes from is handled in its SQL and declared
in PURGE_FOREIGN_KEYS; a test holds that list against pg_constraint, so a new table
that names a job cannot stop the purge unnoticed (the keys are deferred: one forgotten
fails every batch at commit). A job whose fix-forward edit is still undecided is kept,
and `purge_kept` says which and why.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

import structlog
from django.conf import settings
from django.core.files.storage import FileSystemStorage, storages
from django.db import connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from audit.services import Actor
from jobs.artefact_storage import ARTEFACTS, STORAGE_ERRORS, artefact_storage
from jobs.domain.types import all_types
from jobs.integrations import metrics
from jobs.models import Artefact, PurgeState
from jobs.queries import QUERIES
from jobs.services.transitions import jobs_audit
from jobs.services.uploads import upload_orphans_sweep

log = structlog.get_logger("jobs.purge")
PURGER = Actor.system("purge")
# The audit event that closes a purged job's chain (docs/architecture.md#audit-events).
PURGED = "purged"
# What a purge counts besides jobs (per category), in the order it reports them.
ROW_KINDS = ("artefacts", "dead_letters", "outbox", "params_edits")
# The tables purge deletes from.
PURGED_TABLES = ("jobs", "dead_letters", "artefacts", "event_outbox")


class PurgeForeignKey(NamedTuple):
    """A foreign key into one of PURGED_TABLES, and what purge does with its rows."""

    table: str
    column: str
    target: str
    how: str


# Every foreign key into PURGED_TABLES (tests/jobs/test_purge.py compares this with
# pg_constraint, every app's tables included): purge_delete and the rule
# (jobs_purge_due) handle each. A new one must be handled there and named here.
PURGE_FOREIGN_KEYS: tuple[PurgeForeignKey, ...] = (
    PurgeForeignKey("artefacts", "job_id", "jobs", "deleted with their job; files after commit"),
    PurgeForeignKey(
        "dead_letters",
        "job_id",
        "jobs",
        "closed ones deleted with their job; an open one keeps the job (jobs_purge_ended)",
    ),
    PurgeForeignKey(
        "params_edits",
        "job_id",
        "jobs",
        "deleted with their job once applied or rejected (the decision is in the job's "
        "chain); an undecided one keeps the job (jobs_purge_held) and is reported",
    ),
    PurgeForeignKey(
        "params_edits",
        "dead_letter_id",
        "dead_letters",
        "an edit names a dead letter of its own job: it goes with that job",
    ),
    PurgeForeignKey(
        "jobs",
        "rerun_of_id",
        "jobs",
        "set NULL on a re-run that stays when its original goes; the link stays in the "
        "re-run's hashed `created` entry",
    ),
)
# Why purge_kept keeps a job, in an operator's words (the key is the reason's name).
KEPT_REASONS = {
    # Its dead letter is closed (else the job would not be due): it can only be rejected.
    "edit_waiting": "a fix-forward edit waits for a decision although its dead letter is "
    "closed: reject it on the dead letter's page",
}
# Jobs purge_kept names per reason (the count covers all of them).
KEPT_SAMPLE = 10

# This process's clock for the step: when it may look for due jobs again, and when it
# sweeps orphans next (monotonic seconds).
_next_look = 0.0
_next_sweep = 0.0


def _retention_params(older_than: timedelta | None) -> dict[str, Any]:
    """purge_claim's `types`/`keep`: each type's retention in seconds, or `older_than`
    for every type (manage.py purge --older-than)."""
    types = all_types()
    keep = [
        (older_than if older_than is not None else t.retention).total_seconds()
        for t in types.values()
    ]
    return {"types": list(types), "keep": keep}


def _category(job_type: str) -> str:
    found = all_types().get(job_type)
    return found.category if found is not None else "unknown"


def purge_batch(*, older_than: timedelta | None = None) -> dict[str, Any]:
    """Purge one batch of due jobs in one transaction; returns what went:
    {"jobs": {category: n}, "artefacts": n, "dead_letters": n, "outbox": n}."""
    params = _retention_params(older_than) | {"limit": settings.JOBOPS_PURGE_BATCH}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["purge_claim"], params)
            due = cursor.fetchall()
        if not due:
            return {"jobs": {}}
        categories = {str(job_id): _category(job_type) for job_id, job_type, _ in due}
        jobs_audit(
            entries={
                job_id: {"status": status, "category": categories[str(job_id)]}
                for job_id, _, status in due
            },
            event_type=PURGED,
            actor=PURGER,
        )
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["purge_delete"], {"ids": [job_id for job_id, _, _ in due]})
            _jobs, dead_letters, outbox, edits, unlinked, files = cursor.fetchone()
        per_category = Counter(categories.values())
        transaction.on_commit(lambda: _after_commit(files, per_category))
    if unlinked:
        log.info("purge_reruns_unlinked", count=unlinked)
    return {
        "jobs": dict(per_category),
        "artefacts": len(files),
        "dead_letters": dead_letters,
        "outbox": outbox,
        "params_edits": edits,
    }


def _after_commit(files: list[str], per_category: Counter[str]) -> None:
    for category, count in per_category.items():
        metrics.JOBS_PURGED.labels(category=category).inc(count)
    artefact_files_delete(files)


def artefact_files_delete(names: list[str]) -> int:
    """Delete these files or objects of the artefact storage (their rows are gone); a
    failure is logged and leaves an orphan for the sweep. Returns how many went. On the
    file system the job's emptied folders go too (the disk would fill with them)."""
    storage = storages[ARTEFACTS]
    deleted = 0
    for name in names:
        try:
            storage.delete(name)
            deleted += 1
        except STORAGE_ERRORS as exc:
            log.warning("artefact_delete_failed", name=name, error=repr(exc))
            continue
        if isinstance(storage, FileSystemStorage):
            _remove_empty_folders(storage, name)
    return deleted


def _remove_empty_folders(storage: FileSystemStorage, name: str) -> None:
    """The kind and job folders of `name` (artefacts/<job>/<kind>/<file>), once empty."""
    folder = os.path.dirname(storage.path(name))
    for _level in range(2):
        try:
            os.rmdir(folder)
        except OSError:
            return  # not empty (another file, a concurrent write) or already gone
        folder = os.path.dirname(folder)


def purge_run(
    *,
    older_than: timedelta | None = None,
    budget: float | None = None,
    pause: float = 0.0,
) -> tuple[dict[str, Any], bool]:
    """Batches until none is due or `budget` seconds have passed, `pause` seconds apart.
    Returns what went (as purge_batch, summed) and whether any due job may be left."""
    started = time.monotonic()
    total: dict[str, Any] = {"jobs": {}, **dict.fromkeys(ROW_KINDS, 0)}
    while True:
        removed = purge_batch(older_than=older_than)
        _add(total, removed)
        more = sum(removed["jobs"].values()) >= settings.JOBOPS_PURGE_BATCH
        if not more or (budget is not None and time.monotonic() - started >= budget):
            return total, more
        if pause:
            time.sleep(pause)


def _add(total: dict[str, Any], removed: dict[str, Any]) -> None:
    for key, value in removed.items():
        if isinstance(value, dict):
            bucket = total.setdefault(key, {})
            for name, count in value.items():
                bucket[name] = bucket.get(name, 0) + count
        else:
            total[key] = total.get(key, 0) + value


def purge_extras(*, older_than: timedelta | None = None, dry_run: bool = False) -> dict[str, int]:
    """What JOBOPS_PURGE_EXTRAS removes (or would remove), by name."""
    result = {}
    for name, path in settings.JOBOPS_PURGE_EXTRAS:
        purge: Callable[..., int] = import_string(path)
        result[name] = purge(older_than=older_than, dry_run=dry_run)
    return result


def purge_once() -> dict[str, Any]:
    """The maintain role's `purge` step: a purge run of at most JOBOPS_PURGE_STEP_SECONDS
    (the loop's other steps go on between two), then the extras and, at most once per
    JOBOPS_ARTEFACT_ORPHAN_GRACE, the orphan sweeps (artefacts, uploads). Once nothing
    is due it looks again after JOBOPS_PURGE_INTERVAL_SECONDS. Records the run for the
    dashboard."""
    global _next_look, _next_sweep
    now = time.monotonic()
    if now < _next_look:
        return {}
    removed, more = purge_run(
        budget=settings.JOBOPS_PURGE_STEP_SECONDS, pause=settings.JOBOPS_PURGE_PAUSE_SECONDS
    )
    kept = None
    if not more:
        removed.update(purge_extras())
        if now >= _next_sweep:
            _next_sweep = now + settings.JOBOPS_ARTEFACT_ORPHAN_GRACE.total_seconds()
            grace = settings.JOBOPS_ARTEFACT_ORPHAN_GRACE
            removed["orphans"] = artefact_orphans_sweep() + upload_orphans_sweep(grace=grace)
        kept = purge_kept()
        _next_look = time.monotonic() + settings.JOBOPS_PURGE_INTERVAL_SECONDS
    purge_record(removed, finished=not more, kept=kept)
    return removed


def purge_forget_clock() -> None:
    """Let the next purge_once look at once (tests, a manual run)."""
    global _next_look, _next_sweep
    _next_look = _next_sweep = 0.0


def _removed_anything(removed: dict[str, Any]) -> bool:
    return any(
        (sum(v.values()) if isinstance(v, dict) else v) for v in removed.values() if v is not None
    )


def purge_record(
    removed: dict[str, Any], *, finished: bool, kept: dict[str, Any] | None = None
) -> None:
    """Add a pass to purge_state: a pass that removed something after a finished run
    starts a new run; `finished` (nothing left due) ends the run. `kept` (purge_kept, as
    of a finished pass) replaces what the dashboard says is kept."""
    now = timezone.now()
    with transaction.atomic():
        state, _ = PurgeState.objects.select_for_update().get_or_create(id=1)
        state.checked_at = now
        if kept is not None:
            state.kept = kept
        if _removed_anything(removed):
            if state.started_at is None or state.finished_at is not None:
                state.started_at, state.finished_at, state.removed = now, None, {}
            _add(state.removed, removed)
        if finished and state.started_at is not None and state.finished_at is None:
            state.finished_at = now
        state.save()


def purge_preview(*, older_than: timedelta | None = None) -> dict[str, Any]:
    """What a purge would remove now, without removing anything (manage.py purge
    --dry-run): {"jobs": {category: n}, "artefacts": n, ..., and the extras}."""
    preview: dict[str, Any] = {"jobs": {}, **dict.fromkeys(ROW_KINDS, 0)}
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["purge_due_counts"], _retention_params(older_than))
        rows = cursor.fetchall()
    for job_type, jobs, artefacts, dead_letters, outbox, edits in rows:
        _add(
            preview,
            {
                "jobs": {_category(job_type): jobs},
                "artefacts": artefacts,
                "dead_letters": dead_letters,
                "outbox": outbox,
                "params_edits": edits,
            },
        )
    preview.update(purge_extras(older_than=older_than, dry_run=True))
    return preview


def purge_kept(*, older_than: timedelta | None = None) -> dict[str, Any]:
    """The jobs past their retention that purge keeps, by reason (KEPT_REASONS):
    {reason: {"jobs": n, "sample": [{"job_id", "dead_letter_ids"}, ...]}}; {} when none.
    A job kept for an open dead letter or a live key is not listed: those are
    documented rules, each with its own signal (the open dead letters, the key's TTL)."""
    params = _retention_params(older_than) | {"limit": KEPT_SAMPLE}
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["purge_kept"], params)
        rows = cursor.fetchall()
    if not rows:
        return {}
    return {
        "edit_waiting": {
            "jobs": rows[0][0],
            "sample": [
                {"job_id": job_id, "dead_letter_ids": list(letters or [])}
                for _total, job_id, letters in rows
            ],
        }
    }


def kept_lines(kept: dict[str, Any]) -> list[str]:
    """What purge_kept found, one line per reason, for an operator (manage.py purge, the
    dashboard): how many jobs, why, and the first of them."""
    lines = []
    for reason, found in kept.items():
        named = ", ".join(
            f"job {s['job_id']} (dead letter {', '.join(map(str, s['dead_letter_ids']))})"
            for s in found.get("sample", [])
        )
        more = found["jobs"] - len(found.get("sample", []))
        lines.append(
            f"kept {found['jobs']} jobs: {KEPT_REASONS.get(reason, reason)}: {named}"
            + (f" and {more} more" if more > 0 else "")
        )
    return lines


def artefact_orphans_sweep(*, grace: timedelta | None = None) -> int:
    """Delete the artefact files and objects that no row names and that are older than
    `grace` (JOBOPS_ARTEFACT_ORPHAN_GRACE): a purge's delete that failed after commit,
    a write whose transaction rolled back. Younger ones may belong to a write in
    flight. Lists the whole storage: it runs at most once per grace period. Returns
    how many went."""
    cutoff = timezone.now() - (
        grace if grace is not None else settings.JOBOPS_ARTEFACT_ORPHAN_GRACE
    )
    try:
        job_folders = artefact_storage.listdir("artefacts")[0]
    except STORAGE_ERRORS as exc:  # no folder yet (FileNotFoundError), storage away
        log.info("artefact_sweep_skipped", error=repr(exc))
        return 0
    swept = 0
    for start in range(0, len(job_folders), settings.JOBOPS_PURGE_BATCH):
        names = [
            name
            for folder in job_folders[start : start + settings.JOBOPS_PURGE_BATCH]
            for name in _files_under(f"artefacts/{folder}")
        ]
        known = set(Artefact.objects.filter(file__in=names).values_list("file", flat=True))
        orphans = [
            name
            for name in names
            if name not in known and artefact_storage.get_modified_time(name) < cutoff
        ]
        swept += artefact_files_delete(orphans)
    if swept:
        log.info("artefact_orphans_swept", count=swept)
    return swept


def _files_under(folder: str) -> list[str]:
    """The files of a job's folder, one level of kinds down (artefact_upload_to)."""
    kinds, _files = artefact_storage.listdir(folder)
    return [
        f"{folder}/{kind}/{name}"
        for kind in kinds
        for name in artefact_storage.listdir(f"{folder}/{kind}")[1]
    ]
