"""`manage.py queue pause|resume|status [QUEUE] [--reason TEXT]` (docs/operator-controls.md).

    manage.py queue status [sim] [--json]
    manage.py queue pause sim --reason "ERP down, INC-123" [--as alice]
    manage.py queue resume sim --reason "ERP back" [--as alice]

A pause or resume is audited on the ops chain with its reason, as the operator named
by `--as` (else as the system actor `cli`: whoever holds the host).
"""

from __future__ import annotations

import json

from django.core.management.base import CommandError

from jobs.controls import QUEUE_CONTROL
from jobs.management.acting import OperatorControlCommand
from jobs.selectors import queues_state


class Command(OperatorControlCommand):
    help = "Pause, resume or show queues (docs/operator-controls.md#pausing-a-queue)."
    control = QUEUE_CONTROL
    argument = "queue"

    def _status(self, queue: str | None, *, as_json: bool) -> None:
        states = [s for s in queues_state() if queue is None or s.name == queue]
        if queue is not None and not states:
            raise CommandError(f"no queue {queue!r}")
        if as_json:
            rows = [
                {
                    "name": s.name,
                    "paused": s.paused,
                    "paused_at": s.paused_at.isoformat() if s.paused_at else None,
                    "paused_by": s.paused_by,
                    "reason": s.reason,
                    "pending": s.pending,
                    "queued": s.queued,
                    "oldest_pending_age_seconds": s.oldest_pending_age_seconds,
                }
                for s in states
            ]
            self.stdout.write(json.dumps(rows, indent=2))
            return
        for s in states:
            state = "paused" if s.paused else "running"
            line = f"{s.name:<12} {state:<8} pending {s.pending:<7} queued {s.queued:<6}"
            if s.paused:
                line += (
                    f" since {s.paused_at:%Y-%m-%d %H:%M:%S} by {s.paused_by or 'cli'}: {s.reason}"
                )
            self.stdout.write(line)
