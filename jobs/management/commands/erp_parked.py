"""`manage.py erp_parked list|redrive|discard`: ERP events parked in the outbox
(docs/smallest-deployment.md#parked-erp-events).

    manage.py erp_parked list [--json] [--limit 100] [--after ID]
    manage.py erp_parked redrive EVENT_ID [EVENT_ID ...] [--reason TEXT] [--as alice]
    manage.py erp_parked redrive --all [--reason TEXT] [--as alice]
    manage.py erp_parked discard EVENT_ID [EVENT_ID ...] --reason TEXT [--as alice]

Without a broker, the events the ERP refused for good wait here (with a broker they
wait on the queue `erp.events.parked` instead, and this lists nothing). A re-drive
hands them back to `run_erp_bridge`, which POSTs them again with the same
Idempotency-Key; a discard settles them undelivered. Each is audited on the ops chain
as the operator named by `--as` (else as the system actor `cli`: whoever holds the
host); repeating one changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ApplicationError
from jobs.management.acting import operator_acting
from jobs.selectors import erp_parked_events
from jobs.services.erp_parked import (
    erp_parked_discard,
    erp_parked_redrive,
    erp_parked_redrive_all,
)


class Command(BaseCommand):
    help = (
        "List, re-drive or discard the ERP events parked in the outbox "
        "(docs/smallest-deployment.md#parked-erp-events)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        listing = sub.add_parser("list", help="the parked events, oldest first")
        listing.add_argument("--limit", type=int, default=100)
        listing.add_argument("--after", type=int, default=0, help="page on after this id")
        listing.add_argument("--json", action="store_true")
        redrive = sub.add_parser("redrive", help="hand parked events back to the bridge")
        redrive.add_argument("event_ids", nargs="*", metavar="EVENT_ID")
        redrive.add_argument("--all", action="store_true", help="every parked event")
        redrive.add_argument("--reason", default="", help="the justification (optional)")
        redrive.add_argument("--as", dest="username", help="the operator acting")
        discard = sub.add_parser("discard", help="settle parked events without delivery")
        discard.add_argument("event_ids", nargs="+", metavar="EVENT_ID")
        discard.add_argument("--reason", required=True, help="the justification")
        discard.add_argument("--as", dest="username", help="the operator acting")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "list":
            self._list(options)
            return
        _, actor = operator_acting(options["username"])  # the rows keep no actor: the audit does
        try:
            if options["action"] == "discard":
                results = erp_parked_discard(
                    event_ids=options["event_ids"], reason=options["reason"], actor=actor
                )
            elif options["all"]:
                if options["event_ids"]:
                    raise CommandError("redrive takes EVENT_IDs or --all, not both")
                results = erp_parked_redrive_all(actor=actor, reason=options["reason"])
            else:
                results = erp_parked_redrive(
                    event_ids=options["event_ids"], actor=actor, reason=options["reason"]
                )
        except ApplicationError as exc:
            raise CommandError(exc.one_line()) from exc
        for event_id, outcome in results.items():
            self.stdout.write(f"{event_id} {outcome}")
        if not results:
            self.stdout.write("no parked events")

    def _list(self, options: dict[str, Any]) -> None:
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        events = erp_parked_events(after=options["after"], limit=options["limit"])
        if options["json"]:
            rows = [
                {
                    "id": e.id,
                    "event_id": e.event_id,
                    "job_id": e.job_id,
                    "seq": e.seq,
                    "job_status": e.job_status,
                    "created_at": e.created_at.isoformat(),
                    "parked_at": e.parked_at.isoformat(),
                    "status": e.status,
                    "text": e.text,
                }
                for e in events
            ]
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if settings.JOBOPS_BROKER:
            self.stderr.write(
                "JOBOPS_BROKER is on: refused events are parked on the queue erp.events.parked"
            )
        for e in events:
            text = " ".join(e.text.split())[:120]
            self.stdout.write(
                f"{e.id:<8} {e.event_id} job {e.job_id} seq {e.seq} ({e.job_status})"
                f" parked {e.parked_at:%Y-%m-%d %H:%M:%S} HTTP {e.status}: {text}"
            )
        if not events:
            self.stdout.write("no parked events")
