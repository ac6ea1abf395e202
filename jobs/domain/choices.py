"""The closed value sets of the jobs app's tables (Django TextChoices): each column that
holds one has a CHECK constraint built from it (jobs.models). Apart from the models so
that code which only names a value (a service, a serializer, a filter) reads them
without the tables; jobs.models re-exports every one."""

from __future__ import annotations

from django.db import models


class DeadLetterReason(models.TextChoices):
    NONRETRYABLE = "nonretryable"
    FATAL = "fatal"
    EXHAUSTED = "exhausted"
    WORKER_LOST = "worker_lost"
    DELIVERY_LIMIT = "delivery_limit"
    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"


class DeadLetterState(models.TextChoices):
    OPEN = "open"
    REPLAYED = "replayed"
    DISCARDED = "discarded"


class ParamsEditState(models.TextChoices):
    REQUESTED = "requested"
    APPROVED = "approved"
    REJECTED = "rejected"
    APPLIED = "applied"


class BreakerState(models.TextChoices):
    """A connector breaker's state (docs/connectors.md); the gauge connector_state says
    0, 1, 2 in this order."""

    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"
