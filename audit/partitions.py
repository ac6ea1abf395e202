"""The partitions of audit_logs (docs/architecture.md#partitions).

`audit_logs` is partitioned by RANGE on `part`, a date that the one writer (the SQL
functions of audit/sql/append.sql) sets on every entry:

- a job chain's entries carry the first day of the UTC month of the job's created_at
  (kept on the job row, `jobs.audit_part`), so that a whole chain, its `purged` entry
  months later included, lands in one partition `audit_logs_job_YYYY_MM`;
- every other chain's (the ops chain's) carry the second day of the UTC month of the
  entry's ts: partitions of their own, `audit_logs_ops_YYYY_MM`, by kind then month;
- every entry from before the partitioned log carries 1970-01-01, in `audit_logs_legacy`.

Future partitions are created by the SQL function `audit_create_partitions()` (owned by
the owner role, SECURITY DEFINER, the only thing about partitions the app role may
run); the dispatcher calls it about once an hour (`create_future_partitions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import connection
from prometheus_client import Gauge

# Here rather than in jobs.integrations.metrics: the audit app imports nothing of jobs.
AUDIT_FUTURE_PARTITIONS = Gauge(
    "audit_future_partitions",
    "Months after the current one whose audit_logs partitions (job and ops) both exist "
    "(audit.partitions; the dispatcher's audit_partitions step keeps three ready)",
    multiprocess_mode="mostrecent",
)

LEGACY_PART = date(1970, 1, 1)
LEGACY_PARTITION = "audit_logs_legacy"
# How many months after the current one audit_create_partitions keeps ready (the
# function's own constant; the alert fires below two).
MONTHS_AHEAD = 3


def _month(ts: datetime) -> date:
    ts = ts.astimezone(UTC) if ts.tzinfo else ts
    return date(ts.year, ts.month, 1)


def part_for_job(created_at: datetime) -> date:
    """The part of every entry of the chain of a job created at `created_at`."""
    return _month(created_at)


def part_for_other(ts: datetime) -> date:
    """The part of an entry at `ts` of any chain that is not a job's (the ops chain)."""
    return _month(ts).replace(day=2)


def current_job_part() -> date:
    """A new job's part (the model's default: jobs.audit_part)."""
    return part_for_job(datetime.now(UTC))


def partition_name(part: date) -> str:
    """The partition that holds the entries of `part`."""
    if part <= LEGACY_PART:
        return LEGACY_PARTITION
    if part.day == 1:
        return f"audit_logs_job_{part:%Y_%m}"
    if part.day == 2:
        return f"audit_logs_ops_{part:%Y_%m}"
    raise ValueError(f"no partition holds part {part.isoformat()}: a part is day 1 or 2")


@dataclass(frozen=True)
class Partition:
    name: str
    kind: str  # "job", "ops" or "legacy"
    month: date | None  # first day of the month; None for the legacy partition
    rows_estimate: int  # the planner's estimate (pg_class.reltuples; -1: never analysed)


_PARTITIONS = """
SELECT c.relname, c.reltuples::bigint
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'audit_logs'::regclass
ORDER BY c.relname
"""


def _describe(name: str, rows: int) -> Partition:
    if name == LEGACY_PARTITION:
        return Partition(name, "legacy", None, rows)
    _, _, kind, year, month = name.split("_")
    return Partition(name, kind, date(int(year), int(month), 1), rows)


def list_partitions() -> list[Partition]:
    """Every partition of audit_logs with its kind, month and estimated row count."""
    with connection.cursor() as cursor:
        cursor.execute(_PARTITIONS)
        return [_describe(name, rows) for name, rows in cursor.fetchall()]


def future_months(partitions: list[Partition], today: date | None = None) -> int:
    """How many consecutive months after the current one have both their partitions."""
    today = today or datetime.now(UTC).date()
    have = {(p.kind, p.month) for p in partitions}
    ahead, year, month = 0, today.year, today.month
    while True:
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        if not {("job", date(year, month, 1)), ("ops", date(year, month, 1))} <= have:
            return ahead
        ahead += 1


def create_future_partitions() -> int:
    """Create the current month's and the next MONTHS_AHEAD months' partitions that are
    missing (audit_create_partitions, idempotent); returns how many were created."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT audit_create_partitions()")
        return int(cursor.fetchone()[0])


def partitions_step(*, now: datetime | None = None) -> int:
    """The dispatcher's step: at most once an hour (PARTITIONS_EVERY), create what is
    missing of the next months' partitions, then set the audit_future_partitions gauge.
    Returns how many partitions it created (0 when not due)."""
    global _last_run
    now = now or datetime.now(UTC)
    if _last_run is not None and now - _last_run < PARTITIONS_EVERY:
        return 0
    created = create_future_partitions()
    _last_run = now
    AUDIT_FUTURE_PARTITIONS.set(future_months(list_partitions(), now.date()))
    return created


# How often the dispatcher's step creates partitions: months ahead are there long
# before they are needed, so once an hour per dispatcher process is plenty.
PARTITIONS_EVERY = timedelta(hours=1)
_last_run: datetime | None = None
