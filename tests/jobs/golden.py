"""The recorder and comparer of the golden tests (tests/jobs/test_transition_golden.py,
tests/jobs/test_execution_golden.py).

A golden file (tests/golden/<case>.txt) says, for one kind of change driven through the
public services, what that change wrote: its audit entries (the payload text byte for
byte), its outbox events, and the columns of the job, dead-letter and (when it touched
one) connector-breaker rows it changed.
They were recorded from the start commit of issue 38 (c940624) with `RECORD_GOLDEN=1`;
the normal run compares what the code writes now with them.

Only what differs from run to run is replaced, by value, with placeholders numbered in
order of appearance (so equal values stay equal and the links between them are kept):

- uuids: the jobs as `<job-N>` in creation order, every other uuid (event ids, message
  ids) as `<uuid-N>`;
- timestamps in text, of any format, as `<tsZ>` (a UTC `...Z` string, the audit
  payload's format) or `<ts>` (any other); in a row, as `<set>`;
- chain hashes (an entry's prev_hash and chain_hash, a job's audit_head) as
  `<hash-N>`; every other 64-digit hash (params_hash, a justification's digest) is
  deterministic and stays;
- 32-digit hex (request ids) as `<hex-N>`;
- integer ids, by what they name (the key that holds them): users `<user-N>`,
  dead letters `<dl-N>`, organisations `<org-N>`, params edits `<edit-N>`.

An entry's seq is its job chain's; on a shared chain (ops) it is `head+N`, after the
head the chain had before the change (in its payload too, as `"<head+N>"`). The test
runs inside one transaction (pytest-django), where the database's now() does not move:
a timestamp column is listed as changed only when it went from or to NULL, and
`next_run_at` is given as seconds after now() (`next_run_in`), which shows a retry's
delay whichever clock computes it.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from audit.models import AuditLog
from audit.partitions import current_job_part
from audit.services import format_ts
from jobs.models import ConnectorBreaker, DeadLetter, EventOutbox, Job, ParamsEdit
from tenants.models import Organisation

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
START_COMMIT = "c940624"
RECORD = os.environ.get("RECORD_GOLDEN") == "1"

TS_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?P<zone>Z|[+-]\d{2}(?::?\d{2})?)?"
)
UUID_RE = re.compile(
    r"(?<![0-9a-fA-F])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"(?![0-9a-fA-F])"
)
HEX64_RE = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
HEX32_RE = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")
# `"key":123` or `"key":"123"` in compact JSON (canonical text, the outbox payloads).
INT_ID_RE = re.compile(r'"(?P<key>[A-Za-z_]*(?:id|_by))":(?P<q>"?)(?P<value>\d+)(?P=q)(?=[,}\]])')

# What an integer id names, by the key that holds it; "id" is an actor's (a user).
ID_KINDS = {
    "id": "user",
    "owner_id": "user",
    "resolved_by_id": "user",
    "requested_by_id": "user",
    "requested_by": "user",
    "approved_by": "user",
    "resolved_by": "user",
    "approved_by_id": "user",
    "actor_user_id": "user",
    "user_id": "user",
    "changed_by_id": "user",
    "org_id": "org",
    "organisation_id": "org",
    "dead_letter_id": "dl",
    "edit_id": "edit",
    "params_edit_id": "edit",
}


@dataclass
class Normaliser:
    """Placeholders by value, numbered in order of appearance, seeded with the entities
    whose order is known (jobs by creation, users and dead letters by id)."""

    names: dict[tuple[str, str], str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    volatile_hashes: set[str] = field(default_factory=set)

    def name(self, kind: str, value: Any) -> str:
        key = (kind, str(value).lower())
        if key not in self.names:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.names[key] = f"<{kind}-{self.counts[kind]}>"
        return self.names[key]

    def text(self, text: str) -> str:
        text = TS_RE.sub(lambda m: "<tsZ>" if m.group("zone") == "Z" else "<ts>", text)
        text = UUID_RE.sub(lambda m: self._uuid(m.group(0)), text)
        text = HEX64_RE.sub(
            lambda m: self.name("hash", m.group(0))
            if m.group(0) in self.volatile_hashes
            else m.group(0),
            text,
        )
        text = HEX32_RE.sub(lambda m: self.name("hex", m.group(0)), text)
        return INT_ID_RE.sub(self._int_id, text)

    def _uuid(self, value: str) -> str:
        job = ("job", value.lower())
        return self.names[job] if job in self.names else self.name("uuid", value)

    def _int_id(self, match: re.Match[str]) -> str:
        key, quote, value = match.group("key", "q", "value")
        kind = ID_KINDS.get(key, key)
        return f'"{key}":{quote}{self.name(kind, value)}{quote}'

    def json(self, value: Any) -> str:
        return self.text(canonical(value))


def canonical(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain
    )


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} in a golden row")


# --- snapshots ----------------------------------------------------------------------------


def _db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def _rows(model: Any) -> dict[Any, dict[str, Any]]:
    return {row["id"]: row for row in model.objects.values()}


@dataclass
class Snapshot:
    audit_id: int
    outbox_id: int
    jobs: dict[Any, dict[str, Any]]
    dead_letters: dict[Any, dict[str, Any]]
    breakers: dict[Any, dict[str, Any]]
    ops_heads: dict[str, int]

    @classmethod
    def take(cls) -> Snapshot:
        now = _db_now()
        jobs = _rows(Job)
        for row in jobs.values():
            when = row["next_run_at"]
            row["next_run_in"] = None if when is None else round((when - now).total_seconds())
        breakers = {row["name"]: row for row in ConnectorBreaker.objects.values()}
        for row in breakers.values():
            when = row["probe_at"]
            row["probe_in"] = None if when is None else round((when - now).total_seconds())
        heads: dict[str, int] = {}
        for chain, seq in AuditLog.objects.exclude(chain__startswith="job:").values_list(
            "chain", "seq"
        ):
            heads[chain] = max(heads.get(chain, 0), seq)
        return cls(
            audit_id=_max_id(AuditLog),
            outbox_id=_max_id(EventOutbox),
            jobs=jobs,
            dead_letters=_rows(DeadLetter),
            breakers=breakers,
            ops_heads=heads,
        )


def _max_id(model: Any) -> int:
    last = model.objects.order_by("-id").values_list("id", flat=True).first()
    return last or 0


@dataclass
class Capture:
    before: Snapshot | None = None
    after: Snapshot | None = None


@contextmanager
def capture() -> Iterator[Capture]:
    """What the block writes: a snapshot before it and one after it."""
    taken = Capture(before=Snapshot.take())
    yield taken
    taken.after = Snapshot.take()


# --- rendering ----------------------------------------------------------------------------


def render(case: str, taken: Capture) -> str:
    """The golden text of one case: the block's audit entries, outbox events and row
    changes, normalised. Ordered by job (creation order) and sequence, never by
    insertion order, so that a batch written in another order reads the same."""
    before, after = taken.before, taken.after
    assert before is not None and after is not None
    norm = Normaliser()
    job_order = sorted(
        ({**before.jobs, **after.jobs}).values(), key=lambda r: (r["created_at"], str(r["id"]))
    )
    for row in job_order:
        norm.name("job", row["id"])
    index = {str(row["id"]): n for n, row in enumerate(job_order)}
    for pk in get_user_model().objects.order_by("pk").values_list("pk", flat=True):
        norm.name("user", pk)
    for pk in Organisation.objects.order_by("pk").values_list("pk", flat=True):
        norm.name("org", pk)
    dead_letters = sorted(
        ({**before.dead_letters, **after.dead_letters}).values(),
        key=lambda r: (index.get(str(r["job_id"]), -1), r["id"]),
    )
    for row in dead_letters:
        norm.name("dl", row["id"])
    for pk in ParamsEdit.objects.order_by("id").values_list("id", flat=True):
        norm.name("edit", pk)
    norm.volatile_hashes = (
        {h for pair in AuditLog.objects.values_list("prev_hash", "chain_hash") for h in pair}
        | {row["audit_head"] for row in after.jobs.values()}
        | {row["audit_head"] for row in before.jobs.values()}
    )

    def job_key(job_id: Any) -> int:
        return index.get(str(job_id), len(index))

    entries = sorted(
        AuditLog.objects.filter(id__gt=before.audit_id),
        key=lambda e: (e.job_id is None, job_key(e.job_id), e.chain, e.seq),
    )
    events = sorted(
        EventOutbox.objects.filter(id__gt=before.outbox_id),
        key=lambda e: (job_key(e.job_id), e.seq),
    )
    lines = [
        f"# golden: {case} (recorded from the start commit {START_COMMIT};"
        " tests/jobs/golden.py says what is normalised)",
        f"== audit entries: {len(entries)}",
    ]
    for entry in entries:
        # The one timestamp format an entry hashes, which the placeholders hide: the
        # payload's `ts` is its row's, to the microsecond, as audit.services writes it.
        assert json.loads(entry.payload)["ts"] == format_ts(entry.ts), entry.payload
        payload = entry.payload
        seq = str(entry.seq)
        if not entry.chain.startswith("job:"):
            # A shared chain's seq depends on what the database held before the test.
            seq = f"head+{entry.seq - before.ops_heads.get(entry.chain, 0)}"
            payload = payload.replace(f'"seq":{entry.seq},', f'"seq":"<{seq}>",', 1)
        actor_id = norm.name("user", entry.actor_id) if entry.actor_id.isdigit() else entry.actor_id
        lines += [
            f"- chain={norm.text(entry.chain)} seq={seq} event={entry.event_type}"
            f" actor={entry.actor_type}:{actor_id}"
            f" job={norm.text(str(entry.job_id)) if entry.job_id else None}"
            f" ts={norm.text(entry.ts.isoformat())}",
            f"  prev={norm.text(entry.prev_hash)} hash={norm.text(entry.chain_hash)}",
            f"  payload: {norm.text(payload)}",
        ]
    lines.append(f"== outbox events: {len(events)}")
    for event in events:
        lines += [
            f"- job={norm.text(str(event.job_id))} seq={event.seq}"
            f" event_id={norm.text(str(event.event_id))}"
            f" published={event.published_at is not None} parked={event.parked_at is not None}",
            f"  payload: {norm.json(event.payload)}",
        ]
    lines.append("== jobs")
    for row in job_order:
        lines += _row_lines(norm, norm.text(str(row["id"])), before.jobs, after.jobs, row["id"])
    lines.append("== dead letters")
    for row in dead_letters:
        lines += _row_lines(
            norm, norm.name("dl", row["id"]), before.dead_letters, after.dead_letters, row["id"]
        )
    # Only when a change touched a connector's breaker (most do not: their files end
    # above); `probe_in` is its probe time in seconds after now().
    breaker_lines = [
        line
        for name in sorted(before.breakers.keys() | after.breakers.keys())
        for line in _row_lines(norm, name, before.breakers, after.breakers, name)
    ]
    if breaker_lines:
        lines += ["== connector breakers", *breaker_lines]
    return "\n".join(lines) + "\n"


def _row_lines(
    norm: Normaliser, label: str, before: dict[Any, Any], after: dict[Any, Any], pk: Any
) -> list[str]:
    old, new = before.get(pk), after.get(pk)
    if new is None:
        return [f"- {label} deleted"]
    if old is None:
        return [f"- {label} new: {norm.json(_shown(norm, new))}"]
    changed = _changed(norm, old, new)
    return [f"- {label} changed: {norm.json(changed)}"] if changed else []


def _value(norm: Normaliser, column: str, value: Any) -> Any:
    """A column's value as the golden text shows it: a timestamp only as set or not, an
    integer id by what it names."""
    if isinstance(value, datetime):
        return "<set>"
    if column == "audit_part":  # the month the job was created in (audit.partitions)
        return "<this month>" if value == current_job_part() else str(value)
    if column in ID_KINDS and isinstance(value, int) and not isinstance(value, bool):
        return norm.name(ID_KINDS[column], value)
    return value


def _shown(norm: Normaliser, row: dict[str, Any]) -> dict[str, Any]:
    return {
        column: _value(norm, column, value)
        for column, value in row.items()
        if column not in ("id", "name")
    }


def _changed(norm: Normaliser, old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[Any]]:
    """The columns that changed; a timestamp only when it went from or to NULL (now()
    does not move within the test's transaction)."""
    changed: dict[str, list[Any]] = {}
    for column, value in new.items():
        was = old.get(column)
        if isinstance(value, datetime) or isinstance(was, datetime):
            if (was is None) == (value is None):
                continue
        elif was == value:
            continue
        changed[column] = [_value(norm, column, was), _value(norm, column, value)]
    return changed


def check(case: str, taken: Capture) -> None:
    """Record (RECORD_GOLDEN=1) or compare the golden text of `case`."""
    text = render(case, taken)
    path = GOLDEN_DIR / f"{case}.txt"
    if RECORD:
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path}: record it on the start commit (RECORD_GOLDEN=1)"
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), text.splitlines(), f"golden/{path.name}", "now", lineterm=""
        )
        pytest.fail(
            f"{case}: what the code writes differs from the golden file\n" + "\n".join(diff)
        )
