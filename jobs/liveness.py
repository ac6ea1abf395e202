"""The liveness beats under their former path, for the benchmarks (bench/e2e.py), which
run the same code before and after a refactoring: they live in
`jobs.integrations.liveness`. Code in this repository imports that module.
"""

from jobs.integrations.liveness import broker_nodes_detail, live_processes

__all__ = ["broker_nodes_detail", "live_processes"]
