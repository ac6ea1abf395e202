from __future__ import annotations

import json
import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.db_roles import refuse_privileged_database_role
from core.metrics import metrics_serve
from core.metrics_dir import multiprocess_dir_prune
from core.tracing import configure_tracing, flush_tracing
from jobs.processes.dispatcher import ROLES, dispatch_forever, dispatch_once, role_steps
from jobs.services import republish_queued


class Command(BaseCommand):
    help = (
        "Publish pending and due retrying jobs, reap stale locks, relay the event outbox, "
        "write audit checkpoints, cache queue depths and watch dead letters. "
        "Safe to run on several hosts at once."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="run one loop and exit")
        parser.add_argument(
            "--interval",
            type=float,
            default=settings.JOBOPS_DISPATCHER_INTERVAL_SECONDS,
            help="seconds between loops (default JOBOPS_DISPATCHER_INTERVAL_SECONDS)",
        )
        parser.add_argument(
            "--role",
            choices=sorted(ROLES),
            default="all",
            help="all: every step (default); publish: only publish, at once on NOTIFY; "
            "maintain: every step on the clock, no NOTIFY (beside a publisher)",
        )
        parser.add_argument(
            "--republish-queued",
            action="store_true",
            help="first publish every queued job's message again: after a restore, or a "
            "broker that lost its messages (docs/operations/backups.md)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not role_steps(options["role"]):
            raise CommandError(
                f"--role {options['role']} has nothing to do with JOBOPS_BROKER off "
                "(nothing is published): run --role all"
            )
        if options["republish_queued"] and not settings.JOBOPS_BROKER:
            raise CommandError("--republish-queued needs a broker (JOBOPS_BROKER is off)")
        refuse_privileged_database_role()
        configure_tracing("dispatcher")
        if options["republish_queued"]:
            republish_queued()
        if not options["once"]:
            multiprocess_dir_prune()
            metrics_serve()
        if options["once"]:
            self.stdout.write(
                json.dumps(dispatch_once(steps=role_steps(options["role"])), default=str)
            )
            flush_tracing()
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        try:
            dispatch_forever(interval=options["interval"], stop=stop, role=options["role"])
        finally:
            flush_tracing()
