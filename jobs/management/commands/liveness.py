"""manage.py liveness [--json]: which workers and dispatchers are alive
(jobs/integrations/liveness.py)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.integrations.liveness import live_processes, missing_processes


class Command(BaseCommand):
    help = (
        "List the live workers and dispatchers (from their heartbeats in the key-value "
        "store). Exit 1 when no dispatcher is alive or a primary queue has no live worker."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the processes as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        found = live_processes()
        missing = missing_processes(found)
        if options["json"]:
            self.stdout.write(json.dumps({"processes": found, "missing": missing}, indent=2))
        else:
            for kind, processes in sorted(found.items()):
                for p in processes:
                    queues = f" queues={','.join(p['queues'])}" if p["queues"] else ""
                    self.stdout.write(
                        f"{kind:<10} {p['host']}:{p['pid']} beat {p['age_seconds']:.1f}s ago"
                        + queues
                    )
        if missing:
            raise CommandError("No live " + "; no live ".join(missing) + ".", returncode=1)
