"""The outbox relay under its former path, for the benchmarks (bench/events.py), which
run the same code before and after a refactoring: it lives in `jobs.processes.events`.
Code in this repository imports that module.
"""

from jobs.processes.events import outbox_relay_once, outbox_settle_once

__all__ = ["outbox_relay_once", "outbox_settle_once"]
