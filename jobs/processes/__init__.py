"""What the long-running processes run around the services (docs/architecture.md#layers):
the execution core's two adapters (`runtime.py` for a Celery delivery, `executor.py` with
`executor_runners.py` for run_worker), the dispatcher's loop and its step failures, the
outbox relay (`events.py`) and the ERP bridge. Above the services and the execution
core, which never import it; the interfaces (tasks, management commands) start it.
"""
