"""Write paths for jobs: the only code that changes a job.

Split by concern, re-exported here so that callers say `from jobs.services import ...`:

- `transitions`: the kinds of change of docs/architecture.md, each one SQL function
  with its audit entry and event (`change`, `Fence`), `jobs_requeue` (an ended job back
  in line), and `job_audit` for events that change no status;
- `creation`: `job_create`, the API's `job_submit`, validation, idempotency keys;
- `keys`: idempotency keys after creation: a repeat reads the job and marks its key
  seen, the dispatcher's release_keys step releases those past their TTL;
- `cancellation`: `job_cancel`;
- `publishing`: a confirmed publish moves a job to `queued`; the dispatcher's pass;
- `worker`: claim, heartbeat, progress, succeed, retry, cancel confirm, and the
  postgres executor's batches of them (`jobs_claim`, `jobs_heartbeat`);
- `completion`: the completer's write of every run's end, in batches, with its
  connectors' breakers counted in the same transaction (`jobs_complete`, `jobs_finish`);
- `holds`: a worker hands back a queued job it may not run now (a suspended organisation);
- `dead_letters`: failing a job with its dead letter, and the one insert of dead-letter rows;
- `reaper`: reclaiming jobs whose worker was lost;
- `artefacts`: files a job produces;
- `retry`: the owner's retry of a failed job, an operator's re-run of a finished one.
- `requeue`: the one rule that puts an ended job back in line (replay, retry,
  fix-forward, re-run), with the lock order of every dead-letter writer.
- `annotations`: audit enrichment: the check of an annotation's target at creation and
  when it runs, and the fenced `annotated` entry in the annotating job's own chain.
"""

from jobs.services.artefacts import artefact_save
from jobs.services.cancellation import job_cancel, job_cancel_for_user
from jobs.services.completion import Completion, Finish, jobs_complete, jobs_finish
from jobs.services.creation import (
    job_create,
    job_submit,
    params_hash,
    validate_idempotency_key,
    validate_params,
)
from jobs.services.dead_letters import (
    BrokerCopy,
    NewDeadLetter,
    dead_letters_create,
    job_fail_with_dead_letter,
    jobs_fail_with_dead_letters,
    params_edits_settle,
)
from jobs.services.holds import HoldReason, job_hold
from jobs.services.keys import job_key_repeat, job_release_idempotency_keys, release_keys_once
from jobs.services.publishing import job_publish, publish_due_once, republish_queued
from jobs.services.reaper import job_lock_is_stale, job_reclaim, reap_once
from jobs.services.retry import job_rerun, job_retry_failed, job_retry_for_user
from jobs.services.transitions import (
    Fence,
    Progress,
    job_audit,
    job_requeue_with_params,
    jobs_audit,
    jobs_requeue,
)
from jobs.services.worker import (
    WORKER,
    backoff_delay,
    job_cancel_confirm,
    job_claim,
    job_heartbeat,
    job_lock_state,
    job_progress_write,
    job_retry,
    job_succeed,
    jobs_claim,
    jobs_claim_delivered,
    jobs_heartbeat,
    retry_delay,
    validate_result,
)

__all__ = [
    "WORKER",
    "BrokerCopy",
    "Completion",
    "Fence",
    "Finish",
    "HoldReason",
    "NewDeadLetter",
    "Progress",
    "artefact_save",
    "backoff_delay",
    "dead_letters_create",
    "job_audit",
    "job_cancel",
    "job_cancel_confirm",
    "job_cancel_for_user",
    "job_claim",
    "job_create",
    "job_fail_with_dead_letter",
    "job_heartbeat",
    "job_hold",
    "job_key_repeat",
    "job_lock_is_stale",
    "job_lock_state",
    "job_progress_write",
    "job_publish",
    "job_reclaim",
    "job_release_idempotency_keys",
    "job_requeue_with_params",
    "job_rerun",
    "job_retry",
    "job_retry_failed",
    "job_retry_for_user",
    "job_submit",
    "job_succeed",
    "jobs_audit",
    "jobs_claim",
    "jobs_claim_delivered",
    "jobs_complete",
    "jobs_fail_with_dead_letters",
    "jobs_finish",
    "jobs_heartbeat",
    "jobs_requeue",
    "params_edits_settle",
    "params_hash",
    "publish_due_once",
    "reap_once",
    "release_keys_once",
    "republish_queued",
    "retry_delay",
    "validate_idempotency_key",
    "validate_params",
    "validate_result",
]
