"""ERP events parked in the outbox (docs/smallest-deployment.md#parked-erp-events).

Without a broker the ERP bridge delivers outbox rows itself (jobs/processes/erp_bridge.py). A row
the receiver refused for good (a 4xx other than 408/425/429, a redirect) cannot go to
the queue `erp.events.parked` as it does with a broker, so it is parked where it is:
`parked_at`, the response's status and the start of its text on the row
(jobs.models.EventOutbox). Such a row is not published: the claim skips it, it blocks
none of its job's later events, and neither the purge nor `outbox_prune` deletes it.
It waits for an operator (`manage.py erp_parked`):

- **re-drive**: the park is cleared and the bridge takes the row again, in `id` order,
  with the same `event_id`, so the same `Idempotency-Key` (a receiver that accepted it
  meanwhile drops the repeat). Refused again, it is parked again.
- **discard**, with a justification: the row is settled without delivery
  (`published_at` set, the park kept as the record of what was refused) and follows
  the retention of delivered rows.

Each park, re-drive and discard is audited on the ops chain in the transaction that
makes it (`erp_event_parked`, `erp_event_redriven`, `erp_event_discarded`: the event
id, job id, seq and the refusal's status; an operator's justification). The
receiver's text stays out of the chain: it is another system's words, which could
carry personal data, and a hash chain cannot forget it. Each change is a
compare-and-set on "still parked": repeating a re-drive or a discard, or racing
another operator, changes nothing twice and audits nothing twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from audit.services import OPS_CHAIN, Actor, audit_append
from jobs.domain.exceptions import ErpEventNotFoundError, ErpParkedInputError
from jobs.queries import QUERIES
from jobs.selectors import erp_parked_events
from jobs.services.reasons import control_reason

PARKED_EVENT = "erp_event_parked"
REDRIVEN_EVENT = "erp_event_redriven"
DISCARDED_EVENT = "erp_event_discarded"
# Who parks: the bridge, on no operator's behalf.
BRIDGE_ACTOR = Actor.system("erp_bridge")
# Rows one transaction of `erp_parked_redrive_all` re-drives: its row locks and its
# run of ops-chain appends stay short however many events wait.
REDRIVE_CHUNK = 500
# What each command answers per event id.
REDRIVEN, DISCARDED, NOT_PARKED = "redriven", "discarded", "not parked"


@dataclass(frozen=True)
class Refusal:
    """A claimed outbox row the receiver refused for good, with its answer."""

    id: int
    status: int | None
    text: str


def outbox_park(*, refusals: list[Refusal]) -> int:
    """Park the claimed rows `refusals` in the caller's transaction (the bridge's claim,
    after its POSTs) and audit each on the ops chain; returns the rows parked."""
    if not refusals:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["outbox_park"],
            {
                "ids": [r.id for r in refusals],
                "statuses": [r.status for r in refusals],
                "texts": [r.text for r in refusals],
            },
        )
        parked = cursor.fetchall()
    return len(_audited(parked, event_type=PARKED_EVENT, actor=BRIDGE_ACTOR))


def _audited(
    rows: list[tuple[Any, ...]], *, event_type: str, actor: Actor, reason: str = ""
) -> set[str]:
    """Audit each changed row (id, event_id, job_id, seq[, refusal status]) on the ops
    chain in id order, with the justification if any; returns their event ids."""
    for _, event_id, job_id, seq, *status in sorted(rows):
        data: dict[str, Any] = {"event_id": event_id, "job_id": job_id, "seq": seq}
        if status:
            data["status"] = status[0]
        if reason:
            data["reason"] = reason
        audit_append(chain=OPS_CHAIN, event_type=event_type, actor=actor, data=data)
    return {row[1] for row in rows}


def _event_ids(event_ids: Iterable[str]) -> list[str]:
    """The ids as canonical UUID text; ErpParkedInputError for one that is none, or none
    at all; ErpEventNotFoundError for ids the outbox does not hold."""
    checked: list[str] = []
    for raw in event_ids:
        try:
            checked.append(str(uuid.UUID(str(raw).strip())))
        except ValueError:
            raise ErpParkedInputError(
                f"{raw!r} is not an event id (a UUID, as `erp_parked list` shows it)",
                details={"event_id": str(raw)},
            ) from None
    if not checked:
        raise ErpParkedInputError("Name the parked events (their event ids).")
    checked = list(dict.fromkeys(checked))
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["outbox_find"], {"event_ids": checked})
        known = {row[0] for row in cursor.fetchall()}
    missing = [e for e in checked if e not in known]
    if missing:
        raise ErpEventNotFoundError(
            f"No event {', '.join(missing)} in the outbox.", details={"event_ids": missing}
        )
    return checked


def _reason(reason: str, *, required: bool) -> str:
    return control_reason(reason, error=ErpParkedInputError, required=required)


def erp_parked_redrive(
    *, event_ids: Iterable[str], actor: Actor, reason: str = ""
) -> dict[str, str]:
    """Hand the parked events `event_ids` back to the bridge; returns per event id
    `redriven`, or `not parked` for one re-driven or discarded already (nothing written).

    1. Check the ids (ErpParkedInputError, ErpEventNotFoundError: nothing changed).
    2. One transaction: clear the park of those still parked (compare-and-set) and
       audit `erp_event_redriven` for each, with the optional justification.
    """
    reason = _reason(reason, required=False)
    return _settle(
        "outbox_redrive",
        event_ids=_event_ids(event_ids),
        reason=reason,
        actor=actor,
        event_type=REDRIVEN_EVENT,
        outcome=REDRIVEN,
    )


def erp_parked_redrive_all(*, actor: Actor, reason: str = "") -> dict[str, str]:
    """Re-drive every parked event, oldest first, `REDRIVE_CHUNK` to a transaction;
    returns per event id what `erp_parked_redrive` says. An event parked while this
    runs (the bridge refusing one of the re-driven again) is left for the next run."""
    reason = _reason(reason, required=False)
    results: dict[str, str] = {}
    after = 0
    while True:
        page = erp_parked_events(after=after, limit=REDRIVE_CHUNK)
        if not page:
            return results
        after = page[-1].id  # a re-driven row leaves the parked rows: page on by id
        results |= erp_parked_redrive(
            event_ids=[event.event_id for event in page], actor=actor, reason=reason
        )


def erp_parked_discard(*, event_ids: Iterable[str], reason: str, actor: Actor) -> dict[str, str]:
    """Settle the parked events `event_ids` without delivery; returns per event id
    `discarded`, or `not parked` for one re-driven or discarded already.

    1. Check the justification and the ids (nothing changed on a refusal).
    2. One transaction: mark those still parked settled (compare-and-set; the park stays
       as the record of the refusal) and audit `erp_event_discarded` for each, with the
       justification.
    """
    reason = _reason(reason, required=True)
    return _settle(
        "outbox_discard",
        event_ids=_event_ids(event_ids),
        reason=reason,
        actor=actor,
        event_type=DISCARDED_EVENT,
        outcome=DISCARDED,
    )


def _settle(
    statement: str,
    *,
    event_ids: list[str],
    reason: str,
    actor: Actor,
    event_type: str,
    outcome: str,
) -> dict[str, str]:
    """Run the compare-and-set `statement` on the checked `event_ids` and audit each row
    it changed, in one transaction; per event id `outcome`, or `not parked`."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(QUERIES[statement], {"event_ids": event_ids})
            changed = cursor.fetchall()
        done = _audited(changed, event_type=event_type, actor=actor, reason=reason)
    return {e: outcome if e in done else NOT_PARKED for e in event_ids}
