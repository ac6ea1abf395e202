from __future__ import annotations

import json
import signal
import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from jobs.processes.erp_bridge import erp_bridge_run


class Command(BaseCommand):
    help = (
        "POST every job event of the erp.events queue to JOBOPS_ERP_EVENTS_URL with "
        "Idempotency-Key: <event_id> (docs/architecture.md). 5xx/timeouts are retried with "
        "backoff; permanent refusals (4xx) are parked on erp.events.parked. With "
        "JOBOPS_BROKER off it reads the event outbox directly (refusals are parked in it: "
        "manage.py erp_parked)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--once",
            action="store_true",
            help="deliver what is queued, exit after --idle seconds without a message",
        )
        parser.add_argument("--idle", type=float, default=2.0, help="idle seconds for --once")
        parser.add_argument("--max-messages", type=int, default=None)
        parser.add_argument("--url", default=None, help="override JOBOPS_ERP_EVENTS_URL")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        try:
            counts = erp_bridge_run(
                url=options["url"],
                max_messages=options["max_messages"],
                idle_timeout=options["idle"] if options["once"] else None,
                stop=stop,
            )
        except ImproperlyConfigured as exc:  # no URL, no queue: say so, no traceback
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(counts))
