from __future__ import annotations

from typing import Any

from amqp.exceptions import PreconditionFailed
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from kombu import Connection

from jobs.topology import topology


class Command(BaseCommand):
    help = "Declare the RabbitMQ exchanges, queues and bindings of DESIGN.md 4 (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
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
        if conflicts:
            raise CommandError(
                "existing declarations differ from DESIGN.md 4 (arguments cannot change in "
                "place; see README 'Changing queue arguments'):\n  " + "\n  ".join(conflicts)
            )
        self.stdout.write(self.style.SUCCESS("topology is in place"))
