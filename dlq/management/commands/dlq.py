"""`manage.py dlq list|peek|replay|discard|watch`: the dead-letter tools for operators.

    manage.py dlq list [--state open|replayed|discarded|all] [--queue sim_dlq]
    manage.py dlq peek sim_dlq [--limit 20] [--json]
    manage.py dlq replay sim_dlq --as alice --justification "..." [--job ID ...]
                                 [--reason R] [--error-code C] [--limit N]
    manage.py dlq replay sim_dlq --dry-run [--as alice] [same selection]
    manage.py dlq discard sim_dlq --as alice --justification "..." [same selection]
    manage.py dlq watch [--limit 500]

QUEUE names the DLQ (`sim_dlq`); the primary queue's name (`sim`) is accepted too. A dry
run writes nothing, so it needs no `--as` nor `--justification`: without `--as` it shows
what an operator limited to no organisation would take.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ApplicationError
from dlq.broker import dlq_peek
from dlq.selectors import dead_letters_by_error_code, dead_letters_for_messages, dlq_overview
from dlq.services.replay import (
    ResolveResult,
    dead_letters_discard,
    dead_letters_preview,
    dead_letters_replay,
)
from jobs.integrations.topology import dlq_name, dlq_names


class Command(BaseCommand):
    help = "Inspect, peek, replay and discard dead letters (docs/operations/dead-letters.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        listing = sub.add_parser("list", help="each DLQ: broker depth, open rows, error codes")
        listing.add_argument("--queue", help="only this DLQ")
        listing.add_argument(
            "--state", default="open", choices=["open", "replayed", "discarded", "all"]
        )
        listing.add_argument("--json", action="store_true")
        peek = sub.add_parser("peek", help="show broker messages without consuming them")
        peek.add_argument("queue")
        peek.add_argument("--limit", type=int, default=20)
        peek.add_argument("--json", action="store_true")
        for name in ("replay", "discard"):
            act = sub.add_parser(name, help=f"{name} open dead letters (dry run first!)")
            act.add_argument("queue")
            # Required unless --dry-run (checked in _resolve: argparse cannot say so).
            act.add_argument("--as", dest="username", help="the operator (not for --dry-run)")
            act.add_argument("--justification", help="why (not for --dry-run)")
            act.add_argument("--job", dest="job_ids", action="append", metavar="JOB_ID")
            act.add_argument("--reason")
            act.add_argument("--error-code")
            act.add_argument("--limit", type=int)
            act.add_argument("--dry-run", action="store_true")
            act.add_argument("--json", action="store_true")
        watch = sub.add_parser("watch", help="reconcile dlq.watch once (the dispatcher does)")
        watch.add_argument("--limit", type=int, default=500)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except ApplicationError as exc:
            details = f" {json.dumps(exc.details)}" if exc.details else ""
            raise CommandError(f"{exc.code}: {exc.message}{details}") from exc

    # --- actions ------------------------------------------------------------------

    def _list(self, options: dict[str, Any]) -> None:
        queue = self._queue(options["queue"]) if options["queue"] else None
        state = None if options["state"] == "all" else options["state"]
        overview = [o for o in dlq_overview() if queue is None or o["queue"] == queue]
        groups = dead_letters_by_error_code(queue=queue, state=state)
        if options["json"]:
            self.stdout.write(json.dumps({"queues": overview, "groups": groups}, default=str))
            return
        if overview and overview[0]["broker_error"]:
            self.stderr.write(f"broker unreachable: {overview[0]['broker_error']}")
        self.stdout.write(f"{'queue':<16} {'broker depth':>12} {'open rows':>10}")
        for item in overview:
            depth = "?" if item["depth"] is None else str(item["depth"])
            if not item["broker_dlq"]:  # a postgres queue's: no broker DLQ to have a depth
                depth = "no broker"
            self.stdout.write(f"{item['queue']:<16} {depth:>12} {item['open']:>10}")
        self.stdout.write("")
        self.stdout.write(f"{state or 'all'} dead letters by error code:")
        if not groups:
            self.stdout.write("  (none)")
        for g in groups:
            self.stdout.write(
                f"  {g['count']:>6}  {g['queue']:<14} {g['error_code'] or '-':<28} {g['reason']}"
            )

    def _peek(self, options: dict[str, Any]) -> None:
        queue = self._queue(options["queue"])
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        messages = dlq_peek(queue=queue, limit=options["limit"])
        rows = dead_letters_for_messages(messages)
        if options["json"]:
            out = [
                {
                    **m.as_dict(),
                    "dead_letters": [
                        {"id": r.id, "state": r.state, "reason": r.reason}
                        for r in rows[m.message_id]
                    ],
                }
                for m in messages
            ]
            self.stdout.write(json.dumps(out, default=str))
            return
        self.stdout.write(f"{len(messages)} message(s) in {queue} (nothing consumed):")
        for m in messages:
            death = (m.x_death or [{}])[0]
            states = ", ".join(f"#{r.id} {r.state}" for r in rows[m.message_id]) or "no row yet"
            self.stdout.write(
                f"- job {m.job_id or '(none)'} task {m.task or '?'} attempt {m.attempt} "
                f"routing_key {m.routing_key} reason {m.reason} "
                f"x-death count {death.get('count')} at {death.get('time')} [{states}]"
            )
            if m.decode_error:
                self.stdout.write(f"  undecodable: {m.decode_error}; body {m.body_text[:200]!r}")

    def _replay(self, options: dict[str, Any]) -> None:
        self._resolve(dead_letters_replay, options)

    def _discard(self, options: dict[str, Any]) -> None:
        self._resolve(dead_letters_discard, options)

    def _watch(self, options: dict[str, Any]) -> None:
        from dlq.watcher import watch_once

        done = watch_once(limit=options["limit"])
        self.stdout.write(f"reconciled {done} message(s) from dlq.watch")

    # --- helpers ------------------------------------------------------------------

    def _queue(self, name: str) -> str:
        if name in dlq_names():
            return name
        if dlq_name(name) in dlq_names():
            return dlq_name(name)
        raise CommandError(f"unknown queue {name!r}; dead-letter queues: {', '.join(dlq_names())}")

    def _resolve(self, service: Any, options: dict[str, Any]) -> None:
        dry_run, username = options["dry_run"], options["username"]
        if not dry_run:
            missing = [
                flag
                for flag, value in (
                    ("--as", username),
                    ("--justification", options["justification"]),
                )
                if value is None
            ]
            if missing:
                raise CommandError(f"{' and '.join(missing)} needed (not with --dry-run)")
        user = None
        if username is not None:
            user = get_user_model().objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"no user {username!r}")
        if options["limit"] is not None and options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        filters = {"reason": options["reason"], "error_code": options["error_code"]}
        selection: dict[str, Any] = {
            "queue": self._queue(options["queue"]),
            "job_ids": options["job_ids"],
            "filters": {k: v for k, v in filters.items() if v},
            "limit": options["limit"],
        }
        result: ResolveResult
        if user is None:  # a dry run for the shell: nothing written, nobody to name
            result = dead_letters_preview(action=options["action"], **selection)
        else:
            result = service(
                actor_user=user,
                justification=options["justification"] or "",
                dry_run=dry_run,
                **selection,
            )
        if options["json"]:
            self.stdout.write(json.dumps(result.as_dict(), default=str))
            return
        verb = "replay" if result.action == "replay" else "discard"
        for note in result.notes:
            self.stdout.write(note)
        if result.dry_run:
            self.stdout.write(f"dry run: {result.matched} dead letter(s) would {verb}; sample:")
            for s in result.sample:
                self.stdout.write(
                    f"  #{s['dead_letter_id']} job {s['job_id']} {s['reason']} {s['error_code']}"
                )
            return
        done = "replayed" if verb == "replay" else "discarded"
        self.stdout.write(self.style.SUCCESS(f"{done} {len(result.resolved)} dead letter(s)"))
        if result.action == "replay":
            taker = "the dispatcher publishes" if settings.JOBOPS_BROKER else "run_worker takes"
            self.stdout.write(f"the jobs are pending again: {taker} them")
        if settings.JOBOPS_BROKER:  # without a broker there are no copies to speak of
            self.stdout.write(f"broker copies acked: {result.broker_acked}")
        for s in result.skipped:
            self.stdout.write(f"  skipped #{s['dead_letter_id']}: {s['skipped']}")
        if result.broker_error:
            self.stderr.write(
                f"broker copies not acked ({result.broker_error}); the next pass drops them"
            )
