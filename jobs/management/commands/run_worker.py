from __future__ import annotations

import signal
import threading
from typing import Any

import structlog
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.db_roles import refuse_privileged_database_role
from core.metrics import metrics_serve
from core.metrics_dir import multiprocess_dir_prune
from core.tracing import configure_tracing, flush_tracing
from jobs.domain.types import POSTGRES, postgres_queues, queue_executor
from jobs.processes.executor import run_worker

log = structlog.get_logger("jobs.executor")


class Command(BaseCommand):
    help = (
        "Run the jobs of the queues configured JOBOPS_EXECUTOR_<QUEUE>=postgres: claim them "
        "from PostgreSQL in batches (no broker), run them, write their ends in batches "
        "(docs/postgres-executor.md). Safe to run on several hosts at once."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--queues",
            default="",
            help="comma-separated queues (default: every queue configured postgres)",
        )
        parser.add_argument(
            "--concurrency", type=int, default=2, help="jobs run at once (1-256, default 2)"
        )
        parser.add_argument(
            "--pool",
            choices=["processes", "threads"],
            default=None,
            help="runners: processes (CPU-bound work, time limits enforced) or threads "
            "(I/O-bound types); default JOBOPS_WORKER_POOL",
        )
        parser.add_argument(
            "--idle-ok",
            action="store_true",
            help="with no queue configured postgres, stay up doing nothing until SIGTERM "
            "instead of refusing to start (the Procfile's line: every queue on Celery is "
            "the usual case there, not a mistake)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        queues = self._queues(options["queues"])
        concurrency = options["concurrency"]
        if not 1 <= concurrency <= 256:
            raise CommandError(f"--concurrency {concurrency}: must be 1-256")
        if not queues and not options["idle_ok"]:
            raise CommandError(
                "no queue is configured postgres (JOBOPS_EXECUTOR_<QUEUE>=postgres): "
                "nothing to run (--idle-ok stays up anyway)"
            )
        refuse_privileged_database_role()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if not queues:
            # The Procfile's line stays up (honcho ends every process when one exits) and
            # says nothing at the usual log level: every queue on Celery, with the broker,
            # is the usual case there, not something to warn about.
            log.debug("run_worker_idle", why="no queue is configured postgres")
            stop.wait()
            return
        configure_tracing("worker")
        multiprocess_dir_prune()
        metrics_serve()
        try:
            run_worker(
                queues=queues,
                concurrency=concurrency,
                pool=options["pool"] or settings.JOBOPS_WORKER_POOL,
                stop=stop,
            )
        finally:
            flush_tracing()

    @staticmethod
    def _queues(value: str) -> list[str]:
        named = list(dict.fromkeys(q.strip() for q in value.split(",") if q.strip()))
        if not named:
            return postgres_queues()
        for queue in named:
            executor = queue_executor(queue)
            if executor is None:
                raise CommandError(f"unknown queue {queue!r}")
            if executor != POSTGRES:
                raise CommandError(
                    f"queue {queue!r} runs on {executor}: set JOBOPS_EXECUTOR_"
                    f"{queue.upper()}=postgres to run it here"
                )
        return named
