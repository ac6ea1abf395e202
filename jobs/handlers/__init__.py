"""Reference handlers, one module per job type, registered in settings.JOB_TYPES.

Contract (docs/architecture.md): `run(ctx: JobContext, params: dict) -> dict | None`;
handlers run at least once, so they must be idempotent.
"""
