"""`manage.py run_webhooks`: the webhook delivery loop (docs/webhooks.md#delivery)."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from audit.db_roles import refuse_privileged_database_role
from core.metrics import metrics_serve
from core.metrics_dir import multiprocess_dir_prune
from core.tracing import configure_tracing
from jobs.processes.webhooks import WebhookRunner


class Command(BaseCommand):
    help = (
        "Copy job events of the outbox into each subscribed webhook endpoint's queue and "
        "POST them, signed, with retries (docs/webhooks.md)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--poll", type=float, default=0.5, help="seconds between steps")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.JOBOPS_EVENTS_PUBLISH:
            # In the Procfiles whatever the settings: idle rather than exit (and respawn).
            self.stderr.write(
                "JOBOPS_EVENTS_PUBLISH is off: no job event is written, webhooks receive "
                "nothing until it is on"
            )
        refuse_privileged_database_role()
        configure_tracing("webhooks")
        multiprocess_dir_prune()  # the value files of this group's earlier run
        metrics_serve()  # JOBOPS_METRICS_PORT (the Procfile's WEBHOOKS_METRICS_PORT)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        WebhookRunner().run(stop=stop, poll=options["poll"])
