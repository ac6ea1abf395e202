from __future__ import annotations

from typing import Any

from amqp.exceptions import PreconditionFailed
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from kombu import Connection

from core.broker import queue_depths
from jobs.topology import ERP_EVENTS_QUEUE_NAME, erp_configured, topology


class Command(BaseCommand):
    help = "Declare the RabbitMQ exchanges, queues and bindings (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.JOBOPS_BROKER:
            # `make run` calls this in every mode; without a broker there is nothing to do.
            self.stdout.write("JOBOPS_BROKER is off: no RabbitMQ topology to declare")
            return
        conflicts: list[str] = []
        plan = topology()
        with Connection(settings.BROKER_URL, connect_timeout=10) as conn:
            channel = conn.channel()
            for entity in [*plan.exchanges, *plan.queues]:
                try:
                    # Queue.declare also declares its exchange(s) and bindings.
                    entity(channel).declare()
                except PreconditionFailed as exc:
                    # RabbitMQ closes the channel on 406; report and carry on with a new one.
                    conflicts.append(f"{entity.name}: {exc.reply_text}")
                    channel = conn.channel()
                else:
                    self.stdout.write(f"declared {type(entity).__name__.lower()} {entity.name}")
            if not erp_configured():
                self._warn_unconsumed_erp_queue(conn)
        if conflicts:
            raise CommandError(
                "existing declarations differ from the topology (arguments cannot change in "
                "place; see docs/architecture.md#changing-queue-arguments):\n  "
                + "\n  ".join(conflicts)
            )
        self.stdout.write(self.style.SUCCESS("topology is in place"))

    def _warn_unconsumed_erp_queue(self, conn: Connection) -> None:
        """An `erp.events` declared before (an ERP configured then, or an older jobops)
        still receives every event. Left alone: its events may still be wanted, and
        deleting or unbinding it is the operator's decision."""
        ready = queue_depths([ERP_EVENTS_QUEUE_NAME], connection=conn)[ERP_EVENTS_QUEUE_NAME]
        if ready is None:
            return
        self.stderr.write(
            self.style.WARNING(
                f"{ERP_EVENTS_QUEUE_NAME} exists and holds {ready} event(s), but no ERP is "
                "configured (JOBOPS_ERP_EVENTS_URL is not set): it receives every event and "
                "nothing consumes it. Set JOBOPS_ERP_EVENTS_URL and run the bridge, or "
                f"delete it: rabbitmqctl delete_queue {ERP_EVENTS_QUEUE_NAME}"
            )
        )
