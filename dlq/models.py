"""The dead-letter record lives in `jobs.models` (a failed job and its dead letter are
written together); this app holds the operator tooling around it, and the record of a
replay or discard large enough to run in the background."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class BulkAction(models.TextChoices):
    REPLAY = "replay"
    DISCARD = "discard"
    # Jobs cancelled by filter (dlq/cancel.py): the selection holds a jobs filter.
    CANCEL = "cancel"


class BulkState(models.TextChoices):
    QUEUED = "queued"  # accepted; no dispatcher has taken it yet
    RUNNING = "running"  # a dispatcher works through it, a chunk per loop
    DONE = "done"  # every selected dead letter was handled
    STOPPED = "stopped"  # an operator stopped it; what was done stays done
    FAILED = "failed"  # it cannot go on (e.g. the requester lost the permission)


ACTIVE_STATES = (BulkState.QUEUED, BulkState.RUNNING)


class BulkOperation(models.Model):
    """A replay or discard of many dead letters, or a cancel of many jobs by filter
    (action `cancel`), worked through by the dispatcher
    (`dlq.bulk.bulk_operations_run_once`) in chunks, with its progress for the portal.

    The selection is kept as given (queue, ids, filters, limit) and evaluated chunk by
    chunk over the open rows with `id > after_id`, never beyond `up_to_id` (the newest
    dead letter when it started): a replayed job that fails again makes a new row that
    this operation does not chase.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    action = models.CharField(max_length=16, choices=BulkAction.choices)
    queue = models.CharField(max_length=64, null=True, blank=True)
    # {"job_ids": [...] | null, "dead_letter_ids": [...] | null, "filters": {...}}
    selection = models.JSONField(default=dict)
    limit = models.PositiveIntegerField(null=True, blank=True)
    up_to_id = models.BigIntegerField()
    after_id = models.BigIntegerField(default=0)
    justification = models.TextField()
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    state = models.CharField(max_length=16, choices=BulkState.choices, default=BulkState.QUEUED)
    stop_requested = models.BooleanField(default=False)
    stopped_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    total = models.PositiveIntegerField(default=0)  # the dry-run count when it started
    processed = models.PositiveIntegerField(default=0)
    resolved = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    broker_acked = models.PositiveIntegerField(default=0)
    last_error = models.TextField(null=True, blank=True)
    # Which dispatcher works on it, until when: another takes over after a crash.
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "dlq_bulk_operations"
        verbose_name = "background operation"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=BulkState.values), name="bulk_ops_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(action__in=BulkAction.values), name="bulk_ops_action_valid"
            ),
        ]
        indexes = [
            # The dispatcher step: operations still to work on, oldest first.
            models.Index(
                fields=["created_at"],
                name="bulk_ops_active_idx",
                condition=Q(state__in=["queued", "running"]),
            ),
        ]

    def __str__(self) -> str:
        where = "jobs by filter" if self.action == BulkAction.CANCEL else self.queue or "every DLQ"
        return f"{self.action} in {where} ({self.state}, {self.processed}/{self.total})"

    @property
    def percent(self) -> int:
        if self.state == BulkState.DONE:
            return 100
        return min(100, round(100 * self.processed / self.total)) if self.total else 0

    @property
    def subject(self) -> str:
        """What it works through, singular: a cancel handles jobs, the others dead letters."""
        return "job" if self.action == BulkAction.CANCEL else "dead letter"

    @property
    def done_word(self) -> str:
        """What became of each handled row, for "3 cancelled" (not "3 canceled")."""
        return {
            BulkAction.REPLAY: "replayed",
            BulkAction.DISCARD: "discarded",
            BulkAction.CANCEL: "cancelled",
        }.get(BulkAction(self.action), f"{self.action}ed")

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES
