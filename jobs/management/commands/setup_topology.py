from __future__ import annotations

from typing import Any

from amqp.exceptions import PreconditionFailed
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from kombu import Connection

from core.broker import broker_connect, broker_connect_now, queue_convert, queue_depths
from jobs.integrations.topology import (
    ERP_EVENTS_QUEUE_NAME,
    EVENTS_EXCHANGE,
    PROGRESS_ROUTING_KEY,
    convertible_queues,
    erp_configured,
    erp_routing_keys,
    topology,
)


class Command(BaseCommand):
    help = "Declare the RabbitMQ exchanges, queues and bindings (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--convert",
            action="store_true",
            help=(
                "re-declare a dead-letter queue or dlq.watch whose type or arguments "
                "differ (e.g. classic to quorum), moving its messages; never a primary "
                "queue (docs/operations/dead-letters.md#queue-type)"
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.JOBOPS_BROKER:
            # `make run` calls this in every mode; without a broker there is nothing to do.
            self.stdout.write("JOBOPS_BROKER is off: no RabbitMQ topology to declare")
            return
        conflicts: list[str] = []
        plan = topology()
        convertible = {q.name: q for q in convertible_queues()}
        with broker_connect_now(broker_connect(timeout=10)) as conn:
            channel = conn.channel()
            for entity in [*plan.exchanges, *plan.queues]:
                try:
                    # Queue.declare also declares its exchange(s) and bindings.
                    entity(channel).declare()
                except PreconditionFailed as exc:
                    # RabbitMQ closes the channel on 406; report and carry on with a new one.
                    channel = conn.channel()
                    if options["convert"] and entity.name in convertible:
                        self._convert(conn, convertible[entity.name])
                    else:
                        conflicts.append(f"{entity.name}: {exc.reply_text}")
                else:
                    self.stdout.write(f"declared {type(entity).__name__.lower()} {entity.name}")
            if options["convert"]:
                for queue in convertible.values():  # a conversion a crash left half done
                    moved = queue_convert(conn, queue)
                    if moved:
                        self.stdout.write(f"finished converting {queue.name}: {moved} moved")
            if not erp_configured():
                self._warn_unconsumed_erp_queue(conn)
            elif PROGRESS_ROUTING_KEY not in erp_routing_keys() and not conflicts:
                # A declaration adds bindings, never removes one: JOBOPS_ERP_EVENTS_PROGRESS
                # turned off must stop the progress events reaching the ERP (unbinding a
                # binding that is not there is a no-op).
                conn.channel().queue_unbind(
                    ERP_EVENTS_QUEUE_NAME, EVENTS_EXCHANGE.name, PROGRESS_ROUTING_KEY
                )
        if conflicts:
            raise CommandError(
                "existing declarations differ from the topology (arguments cannot change in "
                "place; see docs/architecture.md#changing-queue-arguments; the dead-letter "
                "queues and dlq.watch change with --convert):\n  " + "\n  ".join(conflicts)
            )
        self.stdout.write(self.style.SUCCESS("topology is in place"))

    def _convert(self, conn: Connection, queue: Any) -> None:
        moved = queue_convert(conn, queue)
        self.stdout.write(f"converted queue {queue.name}: {moved} message(s) moved")

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
