"""Uploads: the input files clients store for their jobs (docs/api.md#uploading-an-input).

Only the model lives here (jobs.models re-exports it, and Django finds it there); the
rest keeps to the layers: jobs.services.uploads writes, jobs.selectors.uploads reads,
jobs.api.uploads answers, jobs.handlers.imports reads the bytes in a job.
"""
