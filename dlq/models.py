from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Reason(models.TextChoices):
    NONRETRYABLE = "nonretryable"
    FATAL = "fatal"
    EXHAUSTED = "exhausted"
    WORKER_LOST = "worker_lost"
    DELIVERY_LIMIT = "delivery_limit"
    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"


class State(models.TextChoices):
    OPEN = "open"
    REPLAYED = "replayed"
    DISCARDED = "discarded"


class DeadLetter(models.Model):
    """The authoritative record of a dead letter (DESIGN.md 4.1); the broker DLQ is a copy."""

    job = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.PROTECT, related_name="dead_letters"
    )
    queue = models.CharField(max_length=64)  # the DLQ, `<q>_dlq`
    reason = models.CharField(max_length=32, choices=Reason.choices)
    error_code = models.CharField(max_length=64, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    x_death = models.JSONField(null=True, blank=True)
    headers = models.JSONField(null=True, blank=True)
    body = models.TextField(null=True, blank=True)  # only for messages that name no job
    # Identity of the broker message recorded here (Celery task id, else a digest of the
    # body): the watcher's idempotency key, so a redelivered watch message changes nothing.
    message_id = models.CharField(max_length=255, null=True, blank=True)
    broker_copy = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    justification = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "dead_letters"
        # Beyond view: what an operator may do to a dead letter (admin, API, CLI).
        permissions = [
            ("replay_deadletter", "Can replay dead letters"),
            ("discard_deadletter", "Can discard dead letters"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["job"], condition=Q(state="open"), name="dead_letters_one_open_per_job"
            ),
            # One row per broker message: a repeat of the same message records nothing more.
            models.UniqueConstraint(
                fields=["message_id"],
                condition=Q(message_id__isnull=False),
                name="dead_letters_message_id_uniq",
            ),
            models.CheckConstraint(
                condition=Q(state__in=State.values), name="dead_letters_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(reason__in=Reason.values), name="dead_letters_reason_valid"
            ),
            # A resolved row says who resolved it and why.
            models.CheckConstraint(
                condition=Q(state="open")
                | Q(resolved_at__isnull=False, justification__isnull=False),
                name="dead_letters_resolution_complete",
            ),
        ]
        indexes = [
            # Operator pages: open rows per queue, grouped by error code.
            models.Index(
                fields=["queue", "error_code"],
                name="dl_open_queue_code_idx",
                condition=Q(state="open"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.reason} job={self.job_id} ({self.state})"
