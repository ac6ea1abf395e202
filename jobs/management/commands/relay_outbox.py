from __future__ import annotations

import signal
import threading
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from jobs.processes.events import outbox_prune, outbox_relay_once


class Command(BaseCommand):
    help = (
        "Relay unpublished job events from the outbox to the events.jobs exchange "
        "(docs/architecture.md). The dispatcher does this every loop; this command is for "
        "operators (drain a backlog, relay with the dispatcher stopped, prune old rows)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="relay what is there and exit")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between runs")
        parser.add_argument("--limit", type=int, default=5000, help="events per run at most")
        parser.add_argument(
            "--prune-days",
            type=float,
            default=None,
            help="also delete rows relayed more than this many days ago",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["prune_days"] is not None:
            pruned = outbox_prune(older_than=timedelta(days=options["prune_days"]))
            self.stdout.write(f"pruned {pruned} relayed events")
        if not settings.JOBOPS_BROKER:
            if options["prune_days"] is not None:
                return
            raise CommandError(
                "JOBOPS_BROKER is off: there is no exchange to relay to (the dispatcher "
                "settles the outbox, the ERP bridge reads it: docs/smallest-deployment.md)"
            )
        if options["once"]:
            try:
                relayed = outbox_relay_once(limit=options["limit"])
            except Exception as exc:  # broker down: say so, exit non-zero
                raise CommandError(f"relay failed, nothing marked: {exc!r}") from exc
            self.stdout.write(f"relayed {relayed} events")
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.is_set():
            close_old_connections()  # a database restart must not wedge the loop
            try:
                relayed = outbox_relay_once(limit=options["limit"])
            except Exception as exc:
                self.stderr.write(f"relay failed, will retry: {exc!r}")
                relayed = 0
            if relayed < options["limit"]:  # a full run means a backlog: go on at once
                stop.wait(options["interval"])
