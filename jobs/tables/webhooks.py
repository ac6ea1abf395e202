"""The webhook tables (docs/webhooks.md): endpoints, deliveries, attempts, the fan-out's
cursor. No foreign key to a job or to the outbox: the purge removes those on their own
schedule, and a delivery holds a copy of its event."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class WebhookEndpoint(models.Model):
    """An organisation's receiver of job events (docs/webhooks.md).

    The signing secret is stored encrypted (jobs/services/webhook_secrets.py), never in
    clear; after a rotation the previous one signs too until `previous_secret_until`.
    `disabled_at` is set by an admin, or by delivery after JOBOPS_WEBHOOK_RETRY_WINDOW of
    failures since `failing_since` (then `disabled_reason` says so): its deliveries wait
    and resume when it is enabled again."""

    organisation = models.ForeignKey(
        "tenants.Organisation", on_delete=models.PROTECT, related_name="webhook_endpoints"
    )
    # Only this project's jobs when set; every job of the organisation when NULL.
    project = models.ForeignKey(
        "tenants.Project", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    url = models.CharField(max_length=2048)
    events = ArrayField(models.CharField(max_length=32))
    description = models.CharField(max_length=200, blank=True, default="")
    secret_encrypted = models.TextField()
    previous_secret_encrypted = models.TextField(null=True, blank=True)
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    failing_since = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        db_table = "webhook_endpoints"
        ordering = ["organisation_id", "id"]
        indexes = [models.Index(fields=["organisation"], name="webhook_endpoints_org_idx")]

    def __str__(self) -> str:
        return f"webhook {self.id} of {self.organisation_id}"

    @property
    def enabled(self) -> bool:
        return self.disabled_at is None


class WebhookDelivery(models.Model):
    """One event for one endpoint: a copy of the event's body (no foreign key to the job
    or the outbox: the purge removes those on their own schedule), where its delivery
    stands, and its attempts. `webhook_id` is the `webhook-id` header of every attempt."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="+")
    webhook_id = models.CharField(max_length=64)
    event_type = models.CharField(max_length=32)
    job_id = models.UUIDField()
    seq = models.BigIntegerField()
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        db_table = "webhook_deliveries"
        constraints = [
            # The fan-out may run again over an event (at least once): one row per
            # endpoint and message all the same.
            models.UniqueConstraint(
                fields=["endpoint", "webhook_id"], name="webhook_deliveries_endpoint_msg_uniq"
            )
        ]
        indexes = [
            # The delivery loop: an endpoint's waiting deliveries, per job in seq order.
            models.Index(
                fields=["endpoint", "job_id", "seq"],
                name="webhook_deliveries_waiting_idx",
                condition=Q(delivered_at__isnull=True),
            ),
            # The purge: delivered rows past their retention.
            models.Index(fields=["delivered_at"], name="webhook_deliveries_done_idx"),
        ]

    def __str__(self) -> str:
        return f"delivery {self.webhook_id} to endpoint {self.endpoint_id}"


class WebhookAttempt(models.Model):
    """One POST of a delivery: its answer's status (NULL: none came), how long it
    took and the first 1 KB of the answer or the error."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField()
    response = models.TextField(blank=True, default="")
    manual = models.BooleanField(default=False)

    class Meta:
        db_table = "webhook_attempts"
        indexes = [models.Index(fields=["delivery", "at"], name="webhook_attempts_delivery_idx")]


class WebhookCursor(models.Model):
    """The one row (id 1): how far the fan-out has read the outbox, as the position
    (transaction id, row id) of the last row it copied (jobs/processes/webhooks.py)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_txid = models.BigIntegerField(default=0)
    last_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "webhook_cursor"
