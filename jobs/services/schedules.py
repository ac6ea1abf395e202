"""Recurring schedules (docs/operator-controls.md#recurring-schedules).

A schedule names a job type and params, a cron expression and a time zone. The
dispatcher's `schedules` step (schedules_fire_due) fires each due schedule: every fire
creates one job through job_create, for the schedule's owner in its organisation, under
the idempotency key `schedule:<name>:<fire time ISO>`. The key is unique per owner and
organisation, so two dispatchers firing the same schedule at the same time create one
job (the second create is a repeat), whatever their timing. A dispatcher that was down
creates at most JOBOPS_SCHEDULE_CATCH_UP of the fires it missed (the latest ones).

Every change (add, edit, enable, disable, remove) is audited on the ops chain.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog

# croniter 7 ships no type information (types-croniter describes 6.x).
from croniter import croniter  # type: ignore[import-untyped]
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import OPS_CHAIN, Actor, audit_append
from core.errors import ApplicationError
from jobs.domain.exceptions import ScheduleInvalidError, ScheduleNotFoundError
from jobs.models import Schedule
from jobs.services.creation import job_create, validate_params
from tenants.selectors import Placement

log = structlog.get_logger("jobs.schedules")
SCHEDULER = Actor.system("scheduler")
# A name goes into idempotency keys (printable ASCII, at most 255 with the fire time).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
# Schedules fired per transaction of the step.
FIRE_BATCH = 50
# Fields an edit may change (name and organisation stay: they make the keys).
EDITABLE = frozenset({"job_type", "params", "cron", "timezone", "project", "owner"})


def validate_cron(expression: Any) -> str:
    """A standard five-field cron expression (minute hour day month weekday)."""
    if not isinstance(expression, str) or len(expression) > 100:
        raise ScheduleInvalidError(details={"cron": ["A cron expression of 5 fields."]})
    expression = " ".join(expression.split())
    if len(expression.split(" ")) != 5 or not croniter.is_valid(expression):
        raise ScheduleInvalidError(
            f"{expression!r} is not a cron expression.",
            details={"cron": ["Five fields: minute hour day-of-month month day-of-week."]},
        )
    return expression


def validate_timezone(name: Any) -> str:
    """An IANA time zone name (Europe/Paris, UTC)."""
    try:
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ValueError(name)
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleInvalidError(
            f"{name!r} is not a time zone.",
            details={"timezone": ["An IANA time zone name, e.g. Europe/Paris or UTC."]},
        ) from exc
    return name


def validate_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ScheduleInvalidError(
            details={"name": ["1 to 100 letters, digits, '.', '_' or '-', from a letter or digit."]}
        )
    return name


def next_fire(schedule: Schedule, *, after: datetime) -> datetime:
    """The schedule's first fire time strictly after `after`, in UTC. The expression is
    read in the schedule's time zone (09:00 Europe/Paris is 08:00 UTC in winter)."""
    zone = ZoneInfo(schedule.timezone)
    fire = croniter(schedule.cron, after.astimezone(zone)).get_next(datetime)
    return fire.astimezone(UTC)


def schedule_validate(schedule: Schedule) -> None:
    """Check every field, normalise cron and params (the type's schema), and place the
    owner: a member of the organisation, the project one of its projects."""
    validate_name(schedule.name)
    schedule.cron = validate_cron(schedule.cron)
    schedule.timezone = validate_timezone(schedule.timezone)
    schedule.params = validate_params(
        schedule.job_type,
        schedule.params,
        owner=schedule.owner,
        staff=schedule.owner.is_staff,
        org_id=schedule.org_id,
    )
    if not schedule.owner.memberships.filter(organisation_id=schedule.org_id).exists():
        raise ScheduleInvalidError(details={"owner": ["Not a member of the organisation."]})
    if schedule.project is not None and schedule.project.organisation_id != schedule.org_id:
        raise ScheduleInvalidError(details={"project": ["Not a project of the organisation."]})


def _audit(event_type: str, schedule: Schedule, actor: Actor, **data: Any) -> None:
    audit_append(
        chain=OPS_CHAIN,
        event_type=event_type,
        actor=actor,
        data={
            "schedule_id": schedule.pk,
            "name": schedule.name,
            "org_id": schedule.org_id,
            **data,
        },
    )


def _describe(schedule: Schedule) -> dict[str, Any]:
    # What an entry records of a schedule: its definition, not its params' values
    # (they may hold personal data; the chain is forever).
    return {
        "job_type": schedule.job_type,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "enabled": schedule.enabled,
        "owner_id": schedule.owner_id,
        "project_id": schedule.project_id,
    }


def schedule_create(
    *,
    name: str,
    org: Any,
    owner: Any,
    job_type: str,
    params: Any,
    cron: str,
    timezone_name: str = "UTC",
    project: Any = None,
    enabled: bool = True,
    actor: Actor,
) -> Schedule:
    """Create a schedule (audited `schedule_added`); it first fires at the next fire
    time after now (a new schedule never catches up)."""
    schedule = Schedule(
        name=name,
        org=org,
        owner=owner,
        project=project,
        job_type=job_type,
        params=params,
        cron=cron,
        timezone=timezone_name,
        enabled=enabled,
    )
    return schedule_save(schedule, actor=actor, created=True)


def schedule_save(schedule: Schedule, *, actor: Actor, created: bool | None = None) -> Schedule:
    """Validate and save a new or edited schedule (the admin's form, schedule_create),
    audited `schedule_added` or `schedule_changed`. Its next fire time is recomputed
    from now; an enabled one fires then, a disabled one never."""
    created = schedule.pk is None if created is None else created
    schedule_validate(schedule)
    now = timezone.now()
    schedule.next_fire_at = next_fire(schedule, after=now) if schedule.enabled else None
    with transaction.atomic():
        if created and Schedule.objects.filter(org=schedule.org_id, name=schedule.name).exists():
            raise ScheduleInvalidError(
                details={"name": ["A schedule of this organisation has this name."]}
            )
        schedule.save()
        _audit(
            "schedule_added" if created else "schedule_changed",
            schedule,
            actor,
            **_describe(schedule),
        )
    return schedule


def schedule_set_enabled(*, schedule: Schedule, enabled: bool, actor: Actor) -> Schedule:
    """Enable (from the next fire time after now: no catch-up of the time it was off)
    or disable a schedule, audited `schedule_enabled` / `schedule_disabled`; a no-op
    (nothing audited) when it is already so."""
    with transaction.atomic():
        locked = Schedule.objects.select_for_update().get(pk=schedule.pk)
        if locked.enabled == enabled:
            return locked
        locked.enabled = enabled
        locked.next_fire_at = next_fire(locked, after=timezone.now()) if enabled else None
        locked.save(update_fields=["enabled", "next_fire_at", "updated_at"])
        _audit("schedule_enabled" if enabled else "schedule_disabled", locked, actor)
    return locked


def schedule_remove(*, schedule: Schedule, actor: Actor) -> None:
    """Delete a schedule, audited `schedule_removed` (its jobs stay)."""
    with transaction.atomic():
        _audit("schedule_removed", schedule, actor, **_describe(schedule))
        schedule.delete()


def schedule_get(*, org_slug: str, name: str) -> Schedule:
    schedule = (
        Schedule.objects.select_related("org", "owner", "project")
        .filter(org__slug=org_slug, name=name)
        .first()
    )
    if schedule is None:
        raise ScheduleNotFoundError(f"No schedule {name!r} in {org_slug!r}.")
    return schedule


def fire_times(schedule: Schedule, *, now: datetime, catch_up: int) -> list[datetime]:
    """The fire times due by `now`, from the schedule's next fire time on, keeping the
    latest `catch_up` of them (the others were missed while no dispatcher ran)."""
    if schedule.next_fire_at is None or schedule.next_fire_at > now:
        return []
    due = [schedule.next_fire_at]
    # Bounded walk: a minutely schedule down for a week is 10,080 fires to skip, each
    # microseconds; beyond this many, the latest are found from `now` backwards.
    while len(due) <= 1000:
        following = next_fire(schedule, after=due[-1])
        if following > now:
            break
        due.append(following)
    else:
        zone = ZoneInfo(schedule.timezone)
        walk = croniter(schedule.cron, now.astimezone(zone) + timedelta(microseconds=1))
        due = sorted(walk.get_prev(datetime).astimezone(UTC) for _ in range(catch_up))
    return due[-catch_up:]


def schedule_fire(schedule: Schedule, *, now: datetime) -> int:
    """Fire one (locked) schedule: a job per due fire time (at most the catch-up), then
    the next fire time after now. Returns the jobs it created (a repeat of a key
    another dispatcher used creates none)."""
    catch_up = max(1, settings.JOBOPS_SCHEDULE_CATCH_UP)
    times = fire_times(schedule, now=now, catch_up=catch_up)
    created = 0
    if times and schedule.org.suspended_at is not None:
        # A suspended organisation takes no new jobs (docs/tenancy.md#suspension), as
        # the API refuses them: its fires are skipped, not saved up for its resumption.
        log.warning(
            "schedule_fire_skipped",
            schedule=schedule.name,
            org_id=schedule.org_id,
            reason="org_suspended",
            fires=len(times),
        )
        times_to_create: list[datetime] = []
    else:
        times_to_create = times
    for fire_time in times_to_create:
        key = f"schedule:{schedule.name}:{fire_time.isoformat()}"
        try:
            # A savepoint: a failed create (the organisation suspended, the type's
            # schema changed) must not undo the other schedules' fires of this batch.
            with transaction.atomic():
                _job, new = job_create(
                    owner=schedule.owner,
                    job_type=schedule.job_type,
                    params=schedule.params,
                    idempotency_key=key,
                    actor=SCHEDULER,
                    staff=schedule.owner.is_staff,
                    placement=Placement(org_id=schedule.org_id, project_id=schedule.project_id),
                    correlation_id=key,
                )
        except ApplicationError as exc:
            log.error(
                "schedule_fire_failed",
                schedule=schedule.name,
                org_id=schedule.org_id,
                fire_time=fire_time.isoformat(),
                error=exc.code,
                message=str(exc),
            )
            continue
        created += int(new)
    if times:
        schedule.last_fired_at = times[-1]
    schedule.next_fire_at = next_fire(schedule, after=max(now, times[-1] if times else now))
    schedule.save(update_fields=["last_fired_at", "next_fire_at"])
    return created


def schedules_fire_due(*, now: datetime | None = None) -> dict[str, int]:
    """The dispatcher's `schedules` step: fire every due schedule, a batch per
    transaction, each row taken FOR UPDATE SKIP LOCKED (another dispatcher takes the
    others; a schedule it just fired is no longer due here). Returns the counts."""
    now = now or timezone.now()
    counts = {"fired": 0, "created": 0}
    while True:
        with transaction.atomic():
            batch = list(
                Schedule.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("owner", "org")
                .filter(enabled=True, next_fire_at__lte=now)
                .order_by("next_fire_at")[:FIRE_BATCH]
            )
            for schedule in batch:
                counts["created"] += schedule_fire(schedule, now=now)
                counts["fired"] += 1
        if len(batch) < FIRE_BATCH:
            return counts
