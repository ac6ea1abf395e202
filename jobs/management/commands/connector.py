"""`manage.py connector status|open|close [NAME] [--reason TEXT]` (docs/connectors.md).

    manage.py connector status [erp] [--json]
    manage.py connector open erp --reason "ERP maintenance, INC-123" [--as alice]
    manage.py connector close erp --reason "ERP back" [--as alice]

An open or close is audited on the ops chain with its reason, as the operator named by
`--as` (else as the system actor `cli`: whoever holds the host).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ApplicationError
from jobs.management.acting import operator_acting
from jobs.selectors import connectors_state
from jobs.services.connectors import connector_close, connector_open


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


class Command(BaseCommand):
    help = "Show, open or close connector breakers (docs/connectors.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["open", "close", "status"])
        parser.add_argument("name", nargs="?", help="the connector (status: all when omitted)")
        parser.add_argument("--reason", default="", help="the justification (open, close)")
        parser.add_argument("--as", dest="username", help="the operator acting")
        parser.add_argument("--json", action="store_true", help="status as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        action, name = options["action"], options["name"]
        if action == "status":
            self._status(name, as_json=options["json"])
            return
        if not name:
            raise CommandError(f"connector {action} needs a NAME")
        user, actor = operator_acting(options["username"])
        control = connector_open if action == "open" else connector_close
        try:
            changed = control(name=name, reason=options["reason"], actor=actor, user=user)
        except ApplicationError as exc:
            raise CommandError(exc.one_line()) from exc
        done = "opened" if action == "open" else "closed"
        was = "open" if action == "open" else "closed"
        self.stdout.write(f"{name} {done}" if changed else f"{name} was already {was}")

    def _status(self, name: str | None, *, as_json: bool) -> None:
        states = [s for s in connectors_state() if name is None or s.name == name]
        if name is not None and not states:
            raise CommandError(f"no connector {name!r}")
        if as_json:
            rows = [
                {
                    "name": s.name,
                    "state": s.state,
                    "failures": s.failures,
                    "failure_threshold": s.failure_threshold,
                    "last_error_code": s.last_error_code,
                    "opened_at": _iso(s.opened_at),
                    "next_probe_at": _iso(s.next_probe_at),
                    "probe_started_at": _iso(s.probe_started_at),
                    "job_types": list(s.job_types),
                    "changed_by": s.changed_by,
                    "reason": s.reason,
                }
                for s in states
            ]
            self.stdout.write(json.dumps(rows, indent=2))
            return
        for s in states:
            line = (
                f"{s.name:<12} {s.state:<9} failures {s.failures}/{s.failure_threshold}"
                f" types {','.join(s.job_types)}"
            )
            if s.state == "open" and s.next_probe_at:
                line += f" probe at {s.next_probe_at:%Y-%m-%d %H:%M:%S}"
            if s.last_error_code:
                line += f" last {s.last_error_code}"
            if s.reason:
                line += f" ({s.changed_by or 'cli'}: {s.reason})"
            self.stdout.write(line)
