"""manage.py schedule list|add|enable|disable|remove|fire-due: recurring schedules
(docs/operator-controls.md#recurring-schedules). Exit 2 on any error."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from core.errors import ApplicationError
from core.json import json_loads
from jobs.models import Schedule
from jobs.services.schedules import (
    schedule_create,
    schedule_get,
    schedule_remove,
    schedule_set_enabled,
    schedules_fire_due,
)
from tenants.models import Organisation, Project

# A shell on the host is the operator of last resort: audited as the system's CLI.
CLI = Actor.system("cli")


class Command(BaseCommand):
    help = "Manage recurring schedules: list, add, enable, disable, remove, fire-due."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="every schedule (or one organisation's)")
        listing.add_argument("--org", default=None, help="organisation slug")
        add = sub.add_parser("add", help="create a schedule")
        add.add_argument("name")
        add.add_argument("--org", required=True, help="organisation slug")
        add.add_argument("--owner", required=True, help="username of the jobs' owner")
        add.add_argument("--type", required=True, dest="job_type")
        add.add_argument("--params", default="{}", help="JSON object")
        add.add_argument("--cron", required=True, help="five fields, e.g. '*/5 * * * *'")
        add.add_argument("--timezone", default="UTC", help="IANA name, e.g. Europe/Paris")
        add.add_argument("--project", default=None, help="project slug")
        add.add_argument("--disabled", action="store_true", help="create it disabled")
        for name in ("enable", "disable", "remove"):
            one = sub.add_parser(name, help=f"{name} a schedule")
            one.add_argument("name")
            one.add_argument("--org", required=True, help="organisation slug")
        sub.add_parser("fire-due", help="fire the due schedules now (as the dispatcher does)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, "_" + options["action"].replace("-", "_"))(options)
        except ApplicationError as exc:
            details = f" {json.dumps(exc.details)}" if exc.details else ""
            raise CommandError(f"{exc.code}: {exc.message}{details}", returncode=2) from exc

    def _list(self, options: dict[str, Any]) -> None:
        schedules = Schedule.objects.select_related("org", "owner").order_by("org__slug", "name")
        if options["org"]:
            schedules = schedules.filter(org__slug=options["org"])
        for s in schedules:
            state = "enabled" if s.enabled else "disabled"
            following = s.next_fire_at.isoformat() if s.next_fire_at else "-"
            self.stdout.write(
                f"{s.org.slug}/{s.name}\t{s.job_type}\t{s.cron}\t{s.timezone}\t{state}\t"
                f"next {following}\towner {s.owner.get_username()}"
            )

    def _add(self, options: dict[str, Any]) -> None:
        try:
            params = json_loads(options["params"])
        except ValueError as exc:
            raise CommandError(f"--params is not valid JSON: {exc}", returncode=2) from exc
        org = Organisation.objects.filter(slug=options["org"]).first()
        if org is None:
            raise CommandError(f"No organisation {options['org']!r}.", returncode=2)
        owner = get_user_model().objects.filter(username=options["owner"]).first()
        if owner is None:
            raise CommandError(f"No user {options['owner']!r}.", returncode=2)
        project = None
        if options["project"]:
            project = Project.objects.filter(organisation=org, slug=options["project"]).first()
            if project is None:
                raise CommandError(
                    f"No project {options['project']!r} in {org.slug}.", returncode=2
                )
        schedule = schedule_create(
            name=options["name"],
            org=org,
            owner=owner,
            project=project,
            job_type=options["job_type"],
            params=params,
            cron=options["cron"],
            timezone_name=options["timezone"],
            enabled=not options["disabled"],
            actor=CLI,
        )
        following = schedule.next_fire_at.isoformat() if schedule.next_fire_at else "-"
        self.stdout.write(f"added {org.slug}/{schedule.name}: next fire {following}")

    def _enable(self, options: dict[str, Any]) -> None:
        schedule = schedule_get(org_slug=options["org"], name=options["name"])
        schedule = schedule_set_enabled(schedule=schedule, enabled=True, actor=CLI)
        assert schedule.next_fire_at is not None
        self.stdout.write(
            f"enabled {options['org']}/{schedule.name}: next fire "
            f"{schedule.next_fire_at.isoformat()}"
        )

    def _disable(self, options: dict[str, Any]) -> None:
        schedule = schedule_get(org_slug=options["org"], name=options["name"])
        schedule_set_enabled(schedule=schedule, enabled=False, actor=CLI)
        self.stdout.write(f"disabled {options['org']}/{schedule.name}")

    def _remove(self, options: dict[str, Any]) -> None:
        schedule = schedule_get(org_slug=options["org"], name=options["name"])
        schedule_remove(schedule=schedule, actor=CLI)
        self.stdout.write(f"removed {options['org']}/{options['name']}")

    def _fire_due(self, options: dict[str, Any]) -> None:
        counts = schedules_fire_due()
        self.stdout.write(
            f"fired {counts['fired']} schedule(s), created {counts['created']} job(s)"
        )
