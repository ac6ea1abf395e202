"""The handler's context under the path handler authors import (`jobs.runtime.JobContext`,
docs/architecture.md#the-handler-contract): it is defined in `jobs.execution.context`,
and the Celery adapter that was this module lives in `jobs.processes.runtime`. Code in
this repository imports those modules.
"""

from jobs.execution.context import JobContext

__all__ = ["JobContext"]
