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

from django.core.management.base import CommandError

from jobs.controls import CONNECTOR_CONTROL
from jobs.management.acting import OperatorControlCommand
from jobs.selectors import connectors_state


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


class Command(OperatorControlCommand):
    help = "Show, open or close connector breakers (docs/connectors.md)."
    control = CONNECTOR_CONTROL
    argument = "name"

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
