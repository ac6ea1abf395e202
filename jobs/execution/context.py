"""What a handler gets: `JobContext` (docs/architecture.md#the-handler-contract), the same
under both executors, and the lock holder name a claim takes (`worker_identity`)."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings

from jobs.domain.errors import JobCancelled
from jobs.domain.exceptions import JobLost
from jobs.domain.progress import metrics_checked
from jobs.models import Artefact, Job
from jobs.services import Fence, artefact_save, job_lock_state, job_progress_write


def worker_identity(hostname: str | None = None) -> str:
    """A lock holder name unique per claim: host, process and a random suffix."""
    return f"{hostname or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class JobContext:
    """What a handler gets (docs/architecture.md): `handler(ctx, params) -> dict | None`."""

    def __init__(self, *, job: Job, fence: Fence, log: Any) -> None:
        self.job_id = job.id
        self.job_type = job.type
        # Handlers read and write only this owner's data (a report lists their jobs),
        # and never outside the job's tenant (docs/tenancy.md#execution).
        self.owner_id = job.owner_id
        self._org_id: int = job.org_id
        self._project_id: int | None = job.project_id
        self.attempt = fence.attempt
        # Stable across attempts: external systems recognise a repeated side effect.
        self.idempotency_key = str(job.id)
        self.log = log
        self._fence = fence
        self._lock = threading.Lock()
        self._lost = threading.Event()
        self._cancel_seen = bool(job.cancel_requested)
        self._percent = int(job.progress_percent or 0)
        self._pending: dict[str, Any] | None = None
        self._last_write = float("-inf")
        self._last_cancel_check = time.monotonic()
        self.started = time.monotonic()  # the attempt's start (its claim): its duration
        # Its hard time limit (monotonic), set by the core for a heartbeat loop that
        # enforces it (jobs.execution.heartbeat: a Celery threads pool); None: not here.
        self.deadline: float | None = None
        # The breaker its connector's gate let it call through (jobs.services.connectors):
        # for a connector with providers, the provider chosen (`.provider`, its `.url`);
        # None for a type without a connector. Set before the handler runs.
        self.provider: Any = None

    @property
    def org_id(self) -> int:
        """The job's organisation (read-only: a handler cannot step into another)."""
        return self._org_id

    @property
    def project_id(self) -> int | None:
        """The job's project within its organisation, if it has one (read-only)."""
        return self._project_id

    # --- the handler API ------------------------------------------------------------
    def progress(
        self,
        percent: float,
        step: str | None = None,
        message: str | None = None,
        *,
        metrics: Mapping[str, int | float] | None = None,
    ) -> None:
        """Report progress: monotonic within the attempt (never goes back; the claim
        started it from zero), coalesced to one write per JOBOPS_PROGRESS_INTERVAL_SECONDS;
        the last value is always flushed with the final transition. `metrics`: the
        moment's numbers (name -> int or float), shown with the progress and stored on
        the job row, not in the audit entry; bounded by jobs.domain.progress, which
        raises ProgressMetricsError (the job fails, not the worker) before anything of
        this value is kept."""
        checked = metrics_checked(metrics)
        self._ensure_alive()
        with self._lock:
            self._percent = max(self._percent, max(0, min(100, int(percent))))
            value: dict[str, Any] = {"percent": self._percent, "step": step, "message": message}
            if checked:
                value["metrics"] = checked
            self._pending = value
        self._flush_if_due()

    def check_cancel(self) -> None:
        """Raise JobCancelled if cancellation was requested (reads the flag by primary
        key at most every JOBOPS_CANCEL_CHECK_SECONDS; the heartbeat also brings it)."""
        self._ensure_alive()
        if not self._cancel_seen:
            now = time.monotonic()
            if now - self._last_cancel_check >= settings.JOBOPS_CANCEL_CHECK_SECONDS:
                self._last_cancel_check = now
                self._cancel_seen = job_lock_state(job_id=self.job_id, fence=self._fence)
        if self._cancel_seen:
            raise JobCancelled(f"job {self.job_id}: cancellation requested")

    def save_artefact(
        self,
        kind: str,
        name: str,
        data: bytes | str | IO[bytes],
        content_type: str = "application/octet-stream",
    ) -> Artefact:
        """Upsert a file on (job, kind, name); refused (JobLost) once the lock is gone."""
        self._ensure_alive()
        return artefact_save(
            job_id=self.job_id,
            kind=kind,
            name=name,
            data=data,
            content_type=content_type,
            fence=self._fence,
        )

    def cancel_requested(self) -> bool:
        """Whether cancellation was requested, read from the database now."""
        if not self._cancel_seen:
            self._cancel_seen = job_lock_state(job_id=self.job_id, fence=self._fence)
        return self._cancel_seen

    # --- runtime internals ------------------------------------------------------------
    def _ensure_alive(self) -> None:
        if self._lost.is_set():
            raise JobLost(f"job {self.job_id}: lock lost")

    def _flush_if_due(self, *, force: bool = False) -> None:
        with self._lock:
            due = time.monotonic() - self._last_write >= settings.JOBOPS_PROGRESS_INTERVAL_SECONDS
            if self._pending is None or not (due or force):
                return
            value, self._pending = self._pending, None
            self._last_write = time.monotonic()
        try:
            job_progress_write(
                job_id=self.job_id,
                fence=self._fence,
                percent=value["percent"],
                step=value["step"],
                message=value["message"],
                measured=value.get("metrics"),
            )
        except JobLost:
            self._lost.set()
            raise

    def take_pending_progress(self) -> dict[str, Any] | None:
        """The unwritten progress value, for the final transition to carry."""
        with self._lock:
            value, self._pending = self._pending, None
            return value

    # --- what the heartbeat loop tells it (jobs.execution.heartbeat) ------------------
    @property
    def fence(self) -> Fence:
        return self._fence

    def beat_held(self, cancel_requested: bool) -> None:
        """A beat refreshed the lock: note a cancel request it brought, and flush a
        coalesced progress value that waited for its interval (JobLost: refused)."""
        if cancel_requested:
            self._cancel_seen = True
        self._flush_if_due()

    def beat_lost(self) -> None:
        """A beat found the lock gone: the handler's next call to the context raises."""
        self._lost.set()
        self.log.warning("job_lock_lost")

    def hard_limit_passed(self) -> None:
        """The run passed its hard time limit: abandoned (no more beats; the reaper
        reclaims the job). The handler's next call to the context raises JobLost, and
        its end is never written."""
        self._lost.set()
        self.log.error("job_hard_time_limit", left_to_reaper=True)
