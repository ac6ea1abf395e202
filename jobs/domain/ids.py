"""Job ids (jobs.models.Job.id, whose default this is; migration jobs 0008 names it there)."""

from __future__ import annotations

import uuid

import uuid6


def new_job_id() -> uuid.UUID:
    """A time-ordered id (UUID version 7: milliseconds since the epoch, then random bits).

    A job's id leads the keys of its rows in the biggest indexes: the jobs' primary
    key, its audit chain ('job:<id>', seq) and the audit, outbox and dead-letter
    job_id indexes. Random ids put every new entry on a random page of each, and once
    those outgrow memory every create reads and dirties pages all over (and writes each
    whole into the WAL after a checkpoint); time-ordered ids keep new entries together
    at one end. Still unguessable: 74 random bits.
    """
    return uuid.UUID(int=uuid6.uuid7().int)
