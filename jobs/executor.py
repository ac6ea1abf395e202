"""run_worker's liveness kind under its former path, for the benchmarks (bench/e2e.py),
which run the same code before and after a refactoring: run_worker's host lives in
`jobs.processes.executor`. Code in this repository imports that module.
"""

from jobs.processes.executor import LIVENESS_KIND

__all__ = ["LIVENESS_KIND"]
