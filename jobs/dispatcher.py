"""The dispatcher's loop under its former path, for the benchmarks (bench/), which run
the same code before and after a refactoring: it lives in `jobs.processes.dispatcher`.
Code in this repository imports that module.
"""

from jobs.processes.dispatcher import ROLES, dispatch_once, role_steps

__all__ = ["ROLES", "dispatch_once", "role_steps"]
