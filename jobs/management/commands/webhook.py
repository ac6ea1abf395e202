"""`manage.py webhook add|list|disable|enable|rotate|remove` (docs/webhooks.md#the-command).

    manage.py webhook add ORG URL --events job.status.changed[,job.progress] [--project P]
    manage.py webhook list [ORG] [--json]
    manage.py webhook disable|enable|rotate|remove ID [--as alice]

`add` and `rotate` print the secret once. Each change is audited on the ops chain as the
operator named by `--as` (else as the system actor `cli`).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ApplicationError
from jobs.management.acting import operator_acting
from jobs.services.webhooks import (
    webhook_create,
    webhook_delete,
    webhook_get,
    webhook_rotate,
    webhook_set_enabled,
)
from jobs.tables.webhooks import WebhookEndpoint
from tenants.models import Organisation


class Command(BaseCommand):
    help = "Manage organisations' webhook endpoints (docs/webhooks.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        add = sub.add_parser("add", help="register an endpoint; prints its secret once")
        add.add_argument("org", help="the organisation's slug")
        add.add_argument("url")
        add.add_argument("--events", required=True, help="comma-separated event types")
        add.add_argument("--project", default=None, help="only this project's jobs")
        add.add_argument("--as", dest="username", help="the operator acting")
        listing = sub.add_parser("list", help="the endpoints")
        listing.add_argument("org", nargs="?", default=None)
        listing.add_argument("--json", action="store_true")
        for name, what in (
            ("disable", "stop deliveries (they wait)"),
            ("enable", "resume deliveries"),
            ("rotate", "a new secret; the old one signs too for the overlap"),
            ("remove", "delete the endpoint and its deliveries"),
        ):
            one = sub.add_parser(name, help=what)
            one.add_argument("id", type=int)
            one.add_argument("--as", dest="username", help="the operator acting")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "list":
                self._list(options)
                return
            _, actor = operator_acting(options.get("username"))
            if action == "add":
                org = Organisation.objects.filter(slug=options["org"]).first()
                if org is None:
                    raise CommandError(f"No organisation {options['org']!r}.")
                issued = webhook_create(
                    org=org,
                    url=options["url"],
                    events=[e.strip() for e in options["events"].split(",") if e.strip()],
                    project=options["project"],
                    actor=actor,
                    created_by=f"cli:{options.get('username') or ''}",
                )
                self.stdout.write(f"endpoint {issued.endpoint.id}\nsecret {issued.secret}")
                self.stderr.write("The secret is shown only now: store it with the receiver.")
                return
            endpoint = webhook_get(org_ids=None, endpoint_id=options["id"])
            if action == "rotate":
                issued = webhook_rotate(endpoint=endpoint, actor=actor)
                self.stdout.write(f"secret {issued.secret}")
            elif action == "remove":
                webhook_delete(endpoint=endpoint, actor=actor)
                self.stdout.write(f"removed {endpoint.id}")
            else:
                changed = webhook_set_enabled(
                    endpoint=endpoint, enabled=action == "enable", actor=actor
                )
                self.stdout.write(f"{action}d {endpoint.id}" if changed else "unchanged")
        except ApplicationError as exc:
            raise CommandError(exc.one_line()) from exc

    def _list(self, options: dict[str, Any]) -> None:
        rows = WebhookEndpoint.objects.select_related("organisation").order_by("id")
        if options["org"]:
            rows = rows.filter(organisation__slug=options["org"])
        found: list[dict[str, Any]] = [
            {
                "id": e.id,
                "org": e.organisation.slug,
                "url": e.url,
                "events": e.events,
                "enabled": e.enabled,
                "disabled_reason": e.disabled_reason,
            }
            for e in rows[:1000]
        ]
        if options["json"]:
            self.stdout.write(json.dumps(found))
            return
        for row in found:
            state = "enabled" if row["enabled"] else f"disabled ({row['disabled_reason']})"
            self.stdout.write(
                f"{row['id']}\t{row['org']}\t{row['url']}\t{','.join(row['events'])}\t{state}"
            )
