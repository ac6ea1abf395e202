"""The lock order of every dead-letter writer (the jobs, then their dead letters), stated
once in `jobs.services.dead_letters.lock_jobs_then_open_rows` and named here for the
dlq app's writers (reconciliation, replay, discard, fix-forward)."""

from jobs.services.dead_letters import ROW_FIELDS, Locked, lock_jobs_then_open_rows

__all__ = ["ROW_FIELDS", "Locked", "lock_jobs_then_open_rows"]
