"""The job filter language (docs/operator-controls.md#searching-jobs): `param:key=value`
search terms, the params containment filter and its bounds, and JobFilter, what a list
of jobs is narrowed to by the portal's filters, the admin API's filter body and a
cancel of "all matching". Parsing and checking only, plus the one queryset it builds
(jobs_filtered); the reads that use it are jobs.selectors'."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from jobs.domain.states import Status
from jobs.domain.types import primary_queue_names
from jobs.models import Job

# The longest text a search can match exactly: an idempotency key (255 characters).
SEARCH_MAX_CHARS = 255

PARAM_TERM_PREFIX = "param:"
# Bounds of a params filter: a containment test deeper or longer than any sensible
# lookup is refused rather than handed to the GIN index.
PARAMS_FILTER_MAX_DEPTH = 4
PARAMS_FILTER_MAX_CHARS = 1000
_PARAM_KEY = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


class JobFilterError(ValueError):
    """A search term or filter that cannot be read; its text is for the operator."""


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def params_filter_check(value: Any) -> dict[str, Any]:
    """A params filter as `params @> value` takes it: a non-empty JSON object, at most
    PARAMS_FILTER_MAX_DEPTH levels deep and PARAMS_FILTER_MAX_CHARS long as JSON."""
    if not isinstance(value, dict) or not value:
        raise JobFilterError('A params filter is a non-empty JSON object, e.g. {"region": "eu"}.')
    if _depth(value) > PARAMS_FILTER_MAX_DEPTH:
        raise JobFilterError(f"A params filter is at most {PARAMS_FILTER_MAX_DEPTH} levels deep.")
    if len(json.dumps(value, separators=(",", ":"))) > PARAMS_FILTER_MAX_CHARS:
        raise JobFilterError(
            f"A params filter is at most {PARAMS_FILTER_MAX_CHARS} characters as JSON."
        )
    return value


def param_term_parse(term: str) -> dict[str, Any]:
    """`param:key=value` as a params filter: `key` a path of at most
    PARAMS_FILTER_MAX_DEPTH names joined by dots (`a.b=1` is {"a": {"b": 1}}); `value`
    JSON when it reads as JSON (`steps=2` is the number 2, `ok=true` a boolean,
    `name="2"` the string "2"), otherwise the text itself (`region=eu`)."""
    body = term.strip()[len(PARAM_TERM_PREFIX) :]  # the prefix in any case
    key, sep, raw = body.partition("=")
    names = key.strip().split(".")
    if not sep or not all(_PARAM_KEY.match(n) for n in names):
        raise JobFilterError(
            "A params search reads param:key=value (a key of letters, digits, _ or -, "
            'dots for nested keys), e.g. param:region=eu or param:steps=2 or param:name="2".'
        )
    if len(names) > PARAMS_FILTER_MAX_DEPTH:
        raise JobFilterError(f"A params key has at most {PARAMS_FILTER_MAX_DEPTH} parts.")
    raw = raw.strip()
    try:
        value: Any = json.loads(raw, parse_constant=_no_constant)
    except ValueError:
        value = raw
    for name in reversed(names):
        value = {name: value}
    return params_filter_check(value)


def _no_constant(name: str) -> Any:
    raise ValueError(name)  # NaN and Infinity are no JSON a job's params can hold


@dataclass(frozen=True)
class JobFilter:
    """What a list of jobs is narrowed to: the portal's filters and the admin API's
    filter body. Every field is optional; all given ones must hold."""

    status: str | None = None
    type: str | None = None
    queue: str | None = None
    org_id: int | None = None
    owner: str | None = None  # a username
    error_code: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    params: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if v is not None}
        for name in ("created_after", "created_before"):
            if name in data:
                data[name] = data[name].isoformat()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobFilter:
        values = dict(data)
        for name in ("created_after", "created_before"):
            if values.get(name):
                values[name] = datetime.fromisoformat(values[name])
        return cls(**values)

    def describe(self) -> str:
        """The filter in words, for the confirmation page and the audit entry."""
        data = self.as_json()
        if "params" in data:
            data["params"] = json.dumps(data["params"], sort_keys=True)
        return ", ".join(f"{k}={v}" for k, v in data.items()) or "every job"


def jobs_filtered(*, jobs: QuerySet[Job], filters: JobFilter) -> QuerySet[Job]:
    """`jobs` narrowed by `filters`. Params by containment (`params @> ...`, served by
    the jobs_params_gin index), the error code by jobs_last_error_code_idx."""
    lookups: dict[str, Any] = {}
    for name in ("status", "type", "queue", "org_id"):
        if getattr(filters, name) is not None:
            lookups[name] = getattr(filters, name)
    if filters.owner is not None:
        lookups["owner__username"] = filters.owner
    if filters.error_code is not None:
        lookups["last_error_code"] = filters.error_code
    if filters.created_after is not None:
        lookups["created_at__gte"] = filters.created_after
    if filters.created_before is not None:
        lookups["created_at__lt"] = filters.created_before
    if filters.params is not None:
        lookups["params__contains"] = filters.params
    return jobs.filter(**lookups)


# The job list's query parameters that a cancel of "all matching" understands; anything
# else (a project, a dead-letter filter, an id search) is refused rather than ignored,
# so that the cancel never reaches wider than the list the operator looked at.
_LIST_IGNORED = frozenset({"o", "p", "_changelist_filters"})
_LIST_FIELDS = {
    "status__exact": "status",
    "type__exact": "type",
    "queue__exact": "queue",
    "owner": "owner",
    "error_code": "error_code",
}


def job_filter_from_list(query: Any) -> JobFilter:
    """The job list's filters (its query string, a QueryDict) as a JobFilter.

    Dates are whole UTC days as the list's date filter reads them (`to` inclusive);
    the search box counts only as a `param:key=value` term. Raises JobFilterError for a
    parameter it cannot carry over or a value out of bounds."""
    values: dict[str, Any] = {}
    for name in query:
        value = str(query.get(name, "")).strip()
        if name in _LIST_IGNORED or value == "":
            continue
        if name in _LIST_FIELDS:
            values[_LIST_FIELDS[name]] = value
        elif name == "org":
            if not value.isdigit() or len(value) > 18:
                raise JobFilterError("The organisation filter is an organisation's number.")
            values["org_id"] = int(value)
        elif name in ("created_at_from", "created_at_to"):
            day = _parse_day(value)
            if name.endswith("_to"):
                day += timedelta(days=1)
            values["created_after" if name.endswith("_from") else "created_before"] = day
        elif name == "q":
            if not value.lower().startswith(PARAM_TERM_PREFIX) or len(value) > SEARCH_MAX_CHARS:
                raise JobFilterError(
                    "Only a param:key=value search can be cancelled by filter; clear the "
                    "search box or search by params."
                )
            values["params"] = param_term_parse(value)
        else:
            raise JobFilterError(
                f"The filter {name!r} cannot be used to cancel by filter; remove it first."
            )
    return job_filter_check(JobFilter(**values))


def _parse_day(value: str) -> datetime:
    try:
        day = date.fromisoformat(value[:10]) if len(value) == 10 else None
    except ValueError:
        day = None
    if day is None:
        raise JobFilterError(f"{value!r} is no date (YYYY-MM-DD).")
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def job_filter_check(filters: JobFilter) -> JobFilter:
    """Refuse values that no job can have or that exceed a bound (JobFilterError)."""
    if filters.status is not None and filters.status not in Status.values:
        raise JobFilterError(f"Unknown status {filters.status!r}.")
    if filters.type is not None and filters.type not in settings.JOB_TYPES:
        raise JobFilterError(f"Unknown job type {filters.type!r}.")
    if filters.queue is not None and filters.queue not in primary_queue_names():
        raise JobFilterError(f"Unknown queue {filters.queue!r}.")
    if filters.owner is not None and len(filters.owner) > 150:
        raise JobFilterError("A username has at most 150 characters.")
    if filters.error_code is not None and len(filters.error_code) > 64:
        raise JobFilterError("An error code has at most 64 characters.")
    if (
        filters.created_after is not None
        and filters.created_before is not None
        and filters.created_after >= filters.created_before
    ):
        raise JobFilterError("The time range is empty: its start is not before its end.")
    if filters.params is not None:
        params_filter_check(filters.params)
    return filters
