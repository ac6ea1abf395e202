"""The justified operator controls (docs/operator-controls.md, docs/connectors.md): an
operator with a role does one of two actions on a named thing (pause or resume a queue,
open or close a connector's breaker) with a required reason, audited on the ops chain
by the action's service.

The admin API (dlq.api.controls), the portal (config.admin_site) and the commands
(jobs.management.acting) each serve both controls with one piece of code over this
table; what they say stays each control's own (its verbs, and the words for what
was done).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from audit.services import Actor
from jobs.domain.types import all_connectors, primary_queue_names
from jobs.services.connectors import connector_close, connector_open
from jobs.services.queues import queue_pause, queue_resume
from jobs.services.reasons import REASON_MAX_CHARS
from tenants.selectors import operator_org_ids


@dataclass(frozen=True)
class ControlAction:
    verb: str  # pause, open: the word in the URL and on the command line
    done: str  # paused, opened: "sim paused"
    already: str  # what it is when nothing changed: "sim was already paused"
    # The service: True when it changed something, False when the thing was already so.
    run: Callable[..., bool]


@dataclass(frozen=True)
class OperatorControl:
    thing: str  # queue, connector
    permission: str
    reason_max: int
    actions: tuple[ControlAction, ControlAction]
    names: Callable[[], Iterable[str]]  # what may be named (the services refuse others)

    def action(self, verb: str) -> ControlAction:
        """ValueError for a verb that is not one of the control's (callers check first)."""
        for action in self.actions:
            if action.verb == verb:
                return action
        raise ValueError(f"no {self.thing} action {verb!r}")

    @property
    def verbs(self) -> list[str]:
        return [a.verb for a in self.actions]

    def allows(self, user: Any) -> bool:
        """An operator with the control's permission who is not limited to some
        organisations: either action holds or releases every tenant's jobs at once."""
        return bool(user.has_perm(self.permission)) and operator_org_ids(user) is None


def _pause(*, name: str, reason: str, actor: Actor, user: Any) -> bool:
    return queue_pause(queue=name, reason=reason, actor=actor, user=user)


def _resume(*, name: str, reason: str, actor: Actor, user: Any) -> bool:
    # A resume keeps no operator column (the pause row goes); the audit entry names who.
    return queue_resume(queue=name, reason=reason, actor=actor)


QUEUE_CONTROL = OperatorControl(
    thing="queue",
    permission="jobs.pause_queue",
    reason_max=REASON_MAX_CHARS,
    actions=(
        ControlAction(verb="pause", done="paused", already="paused", run=_pause),
        ControlAction(verb="resume", done="resumed", already="resumed", run=_resume),
    ),
    names=primary_queue_names,
)

CONNECTOR_CONTROL = OperatorControl(
    thing="connector",
    permission="jobs.control_connector",
    reason_max=REASON_MAX_CHARS,
    actions=(
        ControlAction(verb="open", done="opened", already="open", run=connector_open),
        ControlAction(verb="close", done="closed", already="closed", run=connector_close),
    ),
    names=lambda: all_connectors().keys(),
)
