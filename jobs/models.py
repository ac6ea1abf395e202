from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import F, Q

from audit.partitions import current_job_part
from jobs.artefact_storage import get_artefact_storage
from jobs.domain.choices import BreakerState as BreakerState
from jobs.domain.choices import DeadLetterReason as DeadLetterReason
from jobs.domain.choices import DeadLetterState as DeadLetterState
from jobs.domain.choices import ParamsEditState as ParamsEditState
from jobs.domain.ids import new_job_id as new_job_id
from jobs.domain.states import Status


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=new_job_id, editable=False)
    type = models.CharField(max_length=32)
    # The type's category when the job was created (docs/configuration.md#job-categories),
    # stored rather than looked up: a type moved to another category later must not
    # change the body of the jobs it already made without a new version (their ETag).
    category = models.CharField(max_length=32)
    queue = models.CharField(max_length=64)
    params = models.JSONField(default=dict)
    # sha256 of the canonical JSON of (type, params): decides idempotent repeats.
    params_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # No index of its own: (owner, created_at) and (owner, idempotency_key) lead with it,
    # and every index is one more write per transition.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    # The organisation (and optional project) the job runs in; fixed at creation
    # (docs/tenancy.md). No index of their own: (org, created_at) leads with org.
    org = models.ForeignKey(
        "tenants.Organisation", on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    project = models.ForeignKey(
        "tenants.Project",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="jobs",
        db_index=False,
    )
    # The job this one re-runs (an operator's re-run of a finished job, docs/
    # operator-controls.md#retry-and-re-run): same type, params and placement, a new life.
    rerun_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="reruns",
        db_index=False,
    )
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # Until when the key deduplicates; then release_keys frees it (jobs/services/keys.py).
    idempotency_expires_at = models.DateTimeField(null=True, blank=True)
    # The key's latest repeat (a create that returned this job), to the second; NULL: none
    # since its creation, which is when the key was first seen (docs/api.md#idempotency).
    idempotency_last_seen_at = models.DateTimeField(null=True, blank=True)
    # 0-9, higher first (docs/operator-controls.md#priority): the order in which the
    # dispatcher takes a queue's pending jobs into its broker window (quorum queues
    # have no priorities); above 7 only with staff powers.
    priority = models.PositiveSmallIntegerField(default=5, db_default=5)
    cancel_requested = models.BooleanField(default=False)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    progress_percent = models.PositiveSmallIntegerField(default=0)
    progress_step = models.CharField(max_length=200, null=True, blank=True)
    progress_message = models.TextField(null=True, blank=True)
    progress_updated_at = models.DateTimeField(null=True, blank=True)
    progress_metrics = models.JSONField(null=True, blank=True)  # jobs.domain.progress
    last_error_code = models.CharField(max_length=64, null=True, blank=True)
    last_error_message = models.TextField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    locked_by = models.CharField(max_length=200, null=True, blank=True)
    locked_at = models.DateTimeField(null=True, blank=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    # When the client asked the job to run (`run_at` on create; NULL: at once). A job
    # with a future run_at waits `scheduled` until the dispatcher's schedule step moves
    # it to `pending` (docs/operator-controls.md#scheduled-jobs).
    run_at = models.DateTimeField(null=True, blank=True)
    dead_letter_queue = models.CharField(max_length=64, null=True, blank=True)
    request_id = models.CharField(max_length=128, null=True, blank=True)
    correlation_id = models.CharField(max_length=128, null=True, blank=True)
    # W3C trace context of the creating request (core/tracing.py), so a publish
    # that happens later in the dispatcher still joins the request's trace.
    traceparent = models.CharField(max_length=55, null=True, blank=True)
    # Bumped by every write except heartbeats; the API's ETag is "<id>-<version>".
    version = models.PositiveIntegerField(default=1)
    # The head (seq, chain_hash) of the job's audit chain. The statement that changes
    # the job appends its audit entry from here under the row lock it already holds, so
    # a transition is one round trip (jobs/sql/20_transitions.sql); the continuity
    # trigger on audit_logs still refuses any entry that does not continue the chain.
    audit_seq = models.PositiveIntegerField(default=0, db_default=0)
    audit_head = models.CharField(max_length=64, default="0" * 64, db_default="0" * 64)
    # The partition of the job's audit chain (audit.partitions): the first day of the
    # UTC month of created_at, so that every entry of the chain, `purged` months later
    # included, lands in one partition. Jobs from before the partitioned log: 1970-01-01.
    audit_part = models.DateField(default=current_job_part, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "jobs"
        # Beyond view: an operator's power over other people's jobs (admin, API).
        permissions = [("cancel_job", "Can cancel any job")]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=Status.values), name="jobs_status_valid"),
            models.CheckConstraint(
                condition=Q(progress_percent__gte=0, progress_percent__lte=100),
                name="jobs_progress_range",
            ),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="jobs_max_attempts_pos"),
            models.CheckConstraint(
                condition=Q(priority__gte=0, priority__lte=9), name="jobs_priority_range"
            ),
            # NULL keys never conflict in PostgreSQL: no key always makes a new job. A
            # key is the owner's within one organisation: never shared between members.
            models.UniqueConstraint(
                fields=["org", "owner", "idempotency_key"], name="jobs_org_owner_idempotency_uniq"
            ),
            # A running job has a lock holder; no other state keeps one.
            models.CheckConstraint(
                condition=Q(status=Status.RUNNING, locked_by__isnull=False)
                | ~Q(status=Status.RUNNING),
                name="jobs_running_has_lock",
            ),
        ]
        indexes = [
            # The API list: the caller's jobs, newest first.
            models.Index(fields=["owner", "-created_at"], name="jobs_owner_created_idx"),
            models.Index(fields=["-created_at"], name="jobs_created_idx"),
            # An organisation's jobs, newest first (org admins, operators limited to some).
            models.Index(fields=["org", "-created_at"], name="jobs_org_created_idx"),
            # Operator dashboard: unfinished jobs per queue and status (however many ended).
            models.Index(
                fields=["queue", "status"],
                name="jobs_unfinished_idx",
                condition=Q(status__in=["pending", "queued", "running", "retrying"]),
            ),
            # Portal search: a job by the request id or idempotency key a caller quotes.
            models.Index(
                fields=["request_id"],
                name="jobs_request_id_idx",
                condition=Q(request_id__isnull=False),
            ),
            models.Index(
                fields=["idempotency_key"],
                name="jobs_idempotency_key_idx",
                condition=Q(idempotency_key__isnull=False),
            ),
            # Gauges' oldest pending job; `priority`, tested by them alone, keeps claims off it.
            models.Index(
                fields=["created_at"],
                name="jobs_pending_idx",
                condition=Q(status=Status.PENDING, priority__gte=0),
            ),
            # Claims and publisher: a queue's pending jobs, highest priority then oldest
            # first (one ordered probe per queue); its leading column lists the queues.
            models.Index(
                F("queue"),
                F("priority").desc(),
                F("created_at"),
                name="jobs_pending_priority_idx",
                condition=Q(status=Status.PENDING),
            ),
            # Dispatcher: retries that have come due.
            models.Index(
                fields=["next_run_at"],
                name="jobs_retry_due_idx",
                condition=Q(status=Status.RETRYING),
            ),
            # Dispatcher: scheduled jobs come due, and the earliest next one (its wake-up).
            models.Index(
                fields=["run_at"],
                name="jobs_scheduled_due_idx",
                condition=Q(status=Status.SCHEDULED),
            ),
            # Purge: per type, only the ended jobs past its retention (purge_claim).
            models.Index(
                fields=["type", "updated_at"],
                name="jobs_ended_idx",
                condition=Q(status__in=["succeeded", "failed", "cancelled"]),
            ),
            # Reaper: running jobs with a stale lock.
            models.Index(
                fields=["locked_at"],
                name="jobs_running_lock_idx",
                condition=Q(status=Status.RUNNING),
            ),
            # A job's re-runs (its admin page links each of them).
            models.Index(
                fields=["rerun_of"],
                name="jobs_rerun_of_idx",
                condition=Q(rerun_of__isnull=False),
            ),
            # Key release: keys past their retention.
            models.Index(
                fields=["idempotency_expires_at"],
                name="jobs_key_expiry_idx",
                condition=Q(idempotency_key__isnull=False),
            ),
            # Portal search and cancel by filter: params by value (`params @> '{"k": v}'`).
            # jsonb_path_ops: smaller and faster than the default opclass, and @> is the
            # only operator the search uses.
            GinIndex(fields=["params"], name="jobs_params_gin", opclasses=["jsonb_path_ops"]),
            # Portal search and cancel by filter: jobs by their last error code.
            models.Index(
                fields=["last_error_code"],
                name="jobs_last_error_code_idx",
                condition=Q(last_error_code__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id} ({self.status})"

    @property
    def etag(self) -> str:
        return f'"{self.id}-{self.version}"'

    @property
    def progress_attempt(self) -> int | None:
        """The attempt the progress fields belong to; None before the first attempt.

        Always the job's latest attempt: each claim resets progress (jobs_claim_*, in
        jobs/sql/20_transitions.sql) and every progress write is fenced to the attempt that holds
        the lock, so no column of its own is needed to say which attempt wrote it."""
        return self.attempts or None


def artefact_upload_to(instance: Artefact, filename: str) -> str:
    return f"artefacts/{instance.job_id}/{instance.kind}/{filename}"


class Artefact(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="artefacts")
    kind = models.CharField(max_length=64)
    name = models.CharField(max_length=255)
    # The storage key (`s3_key` in the API body) in the "artefacts" storage: the file
    # system or S3 (jobs/artefact_storage.py).
    file = models.FileField(
        upload_to=artefact_upload_to, storage=get_artefact_storage, max_length=500
    )
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    content_type = models.CharField(max_length=128, default="application/octet-stream")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "artefacts"
        constraints = [
            # save_artefact is an upsert on this key: a rerun replaces, never duplicates.
            models.UniqueConstraint(
                fields=["job", "kind", "name"], name="artefacts_job_kind_name_uniq"
            ),
            models.CheckConstraint(condition=Q(size__gte=0), name="artefacts_size_nonneg"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


class EventOutbox(models.Model):
    """One row per transition, written in its transaction; the dispatcher relays it.

    Without a broker the ERP bridge delivers the rows itself (jobs/processes/erp_bridge.py), and a
    row the ERP refused for good is parked here (`parked_at`, the response's status and
    the start of its text) until an operator re-drives it (the park cleared: the bridge
    takes it again) or discards it (`published_at` set as well, so that it follows the
    retention of delivered rows). A row waits for delivery while `published_at` and
    `parked_at` are both NULL; it is parked while only `parked_at` is set."""

    event_id = models.UUIDField(unique=True, default=uuid.uuid4, editable=False)
    job_id = models.UUIDField()
    seq = models.BigIntegerField()  # the job's audit sequence of this transition
    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    # Relayed, delivered, or (with parked_at) discarded by an operator: the purge's to prune.
    published_at = models.DateTimeField(null=True, blank=True)
    parked_at = models.DateTimeField(null=True, blank=True)
    park_status = models.PositiveSmallIntegerField(null=True, blank=True)  # the ERP's answer
    park_text = models.TextField(null=True, blank=True)  # its start (event_post keeps 500)

    class Meta:
        db_table = "event_outbox"
        indexes = [
            # Relay and brokerless bridge: events waiting for delivery, in order. Parked
            # rows are left out, so that a claim never walks past them however many wait.
            models.Index(
                fields=["id"],
                name="outbox_waiting_idx",
                condition=Q(published_at__isnull=True, parked_at__isnull=True),
            ),
            # `manage.py erp_parked` and the erp_events_parked gauge: the parked rows only.
            models.Index(
                fields=["id"],
                name="outbox_parked_idx",
                condition=Q(published_at__isnull=True, parked_at__isnull=False),
            ),
            # Purge: a purged job's published rows go with it (jobs/services/purge.py).
            models.Index(fields=["job_id"], name="outbox_job_idx"),
        ]

    def __str__(self) -> str:
        return f"event {self.event_id} job {self.job_id} seq {self.seq}"


class PurgeState(models.Model):
    """The one row (id 1) saying when the purge last looked and what its last run
    removed (jobs/services/purge.py), for the dashboard: a run is the passes from the
    first that found due jobs to the one that found none left."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    checked_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # {"jobs": {category: n}, "artefacts": n, "dead_letters": n, "outbox": n, ...}
    removed = models.JSONField(default=dict)
    # What the last finished run kept although its retention had passed, by reason:
    # {reason: {"jobs": n, "sample": [...]}} (jobs.services.purge.purge_kept).
    kept = models.JSONField(default=dict)

    class Meta:
        db_table = "purge_state"
        constraints = [models.CheckConstraint(condition=Q(id=1), name="purge_state_one_row")]

    def __str__(self) -> str:
        return f"purge checked {self.checked_at}"


class DeadLetter(models.Model):
    """The authoritative record of a dead letter (docs/architecture.md); the broker DLQ is a copy.

    Part of a job's life (a job fails with its dead letter in one transaction), so it
    lives here; `dlq/` holds the operator tooling around it. The table kept its name
    and its permissions their codenames when it moved from the dlq app (migrations
    jobs 0004 and dlq 0004 change Django's state only).
    """

    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.PROTECT, related_name="dead_letters"
    )
    queue = models.CharField(max_length=64)  # the DLQ, `<q>_dlq`
    reason = models.CharField(max_length=32, choices=DeadLetterReason.choices)
    error_code = models.CharField(max_length=64, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    x_death = models.JSONField(null=True, blank=True)
    headers = models.JSONField(null=True, blank=True)
    body = models.TextField(null=True, blank=True)  # only for messages that name no job
    # Identity of the broker message recorded here (Celery task id, else a digest of the
    # body): the watcher's idempotency key, so a redelivered watch message changes nothing.
    message_id = models.CharField(max_length=255, null=True, blank=True)
    broker_copy = models.BooleanField(default=False)
    state = models.CharField(
        max_length=16, choices=DeadLetterState.choices, default=DeadLetterState.OPEN
    )
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
                condition=Q(state__in=DeadLetterState.values), name="dead_letters_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(reason__in=DeadLetterReason.values), name="dead_letters_reason_valid"
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
            # Operator dashboard: failures of the last 24 hours by error code.
            models.Index(fields=["created_at"], name="dl_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.reason} job={self.job_id} ({self.state})"


class Schedule(models.Model):
    """A recurring schedule (docs/operator-controls.md#recurring-schedules): each fire
    of its cron expression, in its time zone, creates one job of `job_type` with
    `params` for `owner` in `org`, under the idempotency key
    `schedule:<name>:<fire time ISO>` (jobs.services.schedules)."""

    name = models.CharField(max_length=100)
    org = models.ForeignKey(
        "tenants.Organisation", on_delete=models.PROTECT, related_name="schedules"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="schedules"
    )
    project = models.ForeignKey(
        "tenants.Project", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    job_type = models.CharField(max_length=32)
    params = models.JSONField(default=dict, blank=True)
    cron = models.CharField(max_length=100, help_text="Five fields: minute hour day month weekday.")
    timezone = models.CharField(max_length=64, default="UTC", help_text="An IANA time zone name.")
    enabled = models.BooleanField(default=True)
    # The fire time (not the wall clock) of the last fire: catch-up counts from it.
    last_fired_at = models.DateTimeField(null=True, blank=True)
    # The next fire time; NULL while disabled. Kept on the row so that the dispatcher's
    # step reads the due schedules with one index probe.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "job_schedules"
        constraints = [
            models.UniqueConstraint(fields=["org", "name"], name="job_schedules_org_name_uniq"),
        ]
        indexes = [
            models.Index(
                fields=["next_fire_at"],
                name="job_schedules_due_idx",
                condition=Q(enabled=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"


class ParamsEdit(models.Model):
    """A fix-forward: an operator's edit of a dead job's params, replayed with them
    (docs/operator-controls.md#fix-forward).

    The audit chain holds only the hashes of the old and new params and the changed
    paths (the values may be personal data); this ordinary table keeps the full diff
    beside it, for the operators who need to see what changed. With
    JOBOPS_REPLAY_APPROVAL an edit is first `requested` and waits for a second
    operator, who approves (it is applied at once) or rejects it.
    """

    dead_letter = models.ForeignKey(
        DeadLetter, on_delete=models.PROTECT, related_name="params_edits"
    )
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="params_edits")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    rejected_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    old_params = models.JSONField()
    new_params = models.JSONField()
    old_params_sha256 = models.CharField(max_length=64)
    new_params_sha256 = models.CharField(max_length=64)
    changed_paths = models.JSONField(default=list)
    reason = models.TextField()
    state = models.CharField(
        max_length=16, choices=ParamsEditState.choices, default=ParamsEditState.REQUESTED
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "params_edits"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=ParamsEditState.values), name="params_edits_state_valid"
            ),
            # Four eyes: whoever approves is not who asked.
            models.CheckConstraint(
                condition=Q(approved_by__isnull=True) | ~Q(approved_by=models.F("requested_by")),
                name="params_edits_four_eyes",
            ),
            # One edit waiting per dead letter: a second request would race the first.
            models.UniqueConstraint(
                fields=["dead_letter"],
                condition=Q(state="requested"),
                name="params_edits_one_requested",
            ),
        ]

    def __str__(self) -> str:
        return f"params edit {self.pk} of job {self.job_id} ({self.state})"


class QueuePause(models.Model):
    """A paused queue (docs/operator-controls.md#pausing-a-queue): while its row exists
    the dispatcher publishes none of the queue's jobs and a worker holds any message of
    it that was already in the broker. In PostgreSQL, so every host sees the same pause;
    set and cleared only by jobs.services.queues (audited on the ops chain)."""

    queue = models.CharField(max_length=64, primary_key=True)
    paused_at = models.DateTimeField()
    paused_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField()

    class Meta:
        db_table = "queue_pauses"
        # Operators pause and resume (the admin API and the dashboard).
        permissions = [("pause_queue", "Can pause and resume a queue")]

    def __str__(self) -> str:
        return f"{self.queue} paused"


class ConnectorBreaker(models.Model):
    """The circuit breaker of one connector, the external system some job types call
    (docs/connectors.md). In PostgreSQL, so every worker host shares it; a connector
    without a row is closed. Changed only by the compare-and-set statements of
    jobs/queries.sql (connector_*) through jobs.services.connectors, each change of
    state audited on the ops chain in the same transaction."""

    name = models.CharField(max_length=64, primary_key=True)
    state = models.CharField(
        max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED
    )
    # Connector failures in a row since its last success (or close).
    failures = models.PositiveIntegerField(default=0)
    last_error_code = models.CharField(max_length=64, null=True, blank=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    # While open: when a job may probe the connector (opened_at + its cool-down).
    probe_at = models.DateTimeField(null=True, blank=True)
    # While half-open: the one job probing, since when (no foreign key: a purge may
    # remove the job; the row only names it).
    probe_job_id = models.UUIDField(null=True, blank=True)
    probe_started_at = models.DateTimeField(null=True, blank=True)
    changed_at = models.DateTimeField()
    # An operator's open or close: who, and their justification ('' for the breaker's own).
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField(blank=True, default="")

    class Meta:
        db_table = "connector_breakers"
        # Operators open and close breakers by hand (the admin API, the dashboard).
        permissions = [("control_connector", "Can open and close a connector's breaker")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=BreakerState.values),
                name="connector_breakers_state_valid",
            ),
            # An open breaker always knows when to let a probe through.
            models.CheckConstraint(
                condition=~models.Q(state=BreakerState.OPEN) | models.Q(probe_at__isnull=False),
                name="connector_breakers_open_has_probe_at",
            ),
        ]

    def __str__(self) -> str:
        return f"connector {self.name} ({self.state})"
