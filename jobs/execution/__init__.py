"""The execution core (docs/architecture.md#executors): claim, run, decide, write the end,
heartbeat and the soft time limit, the same for both executors and knowing neither.

- `context`: `JobContext`, what a handler gets; `worker_identity`, a claim's holder name.
- `run`: `run_claimed`, a claimed job's run through its connector gate, its handler and
  the decision, its end handed to a writer; `Ended`, how it came out.
- `decide`: `finish_decide` and `classify`, how a run ends.
- `complete`: the completer, `write_ends` (every end of both executors) and its windows.
- `claim`: `Claimer`, the claims of a Celery threads-pool worker's deliveries that start
  together, one statement per organisation.
- `batches`: `BatchThread`, the thread the claimer and the threads pool's completer
  share: callers each waiting for their own answer, served in windows.
- `heartbeat`: `HeartbeatLoop`, the one loop that keeps the held jobs' locks alive.
- `limits`: `SoftLimit`, the soft time limit its adapter hands the core.

The adapters: `jobs.processes.runtime` (the Celery task's delivery: message, claim, reject or
requeue) and `jobs.processes.executor` (run_worker's host, its runners and child processes).
Nothing here imports Celery (an import-linter contract holds it).
"""
