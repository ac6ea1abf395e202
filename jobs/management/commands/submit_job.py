"""manage.py submit_job --type T --params JSON [--key K] [--owner USERNAME] [--org SLUG]
[--project SLUG]"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ApplicationError
from core.json import json_loads
from jobs.services import job_create
from tenants.selectors import placement_for


class Command(BaseCommand):
    help = (
        "Submit a job as a user (default: the first administrator), exactly as the API would. "
        "Prints the job id and status. Exit 2 on any error."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--type", required=True, dest="job_type", help="e.g. sim, report")
        parser.add_argument("--params", default="{}", help="JSON object, e.g. '{\"steps\": 5}'")
        parser.add_argument("--key", default=None, help="idempotency key (repeat: same job)")
        parser.add_argument("--owner", default=None, help="username (default: first superuser)")
        parser.add_argument(
            "--org", default=None, help="organisation slug (needed if the owner is in several)"
        )
        parser.add_argument("--project", default=None, help="project slug in that organisation")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            params = json_loads(options["params"])
        except ValueError as exc:  # not JSON, or a number too long to read
            raise CommandError(f"--params is not valid JSON: {exc}", returncode=2) from exc
        owner = _owner(options["owner"])
        try:
            placement = placement_for(owner, org=options["org"], project=options["project"])
            job, created = job_create(
                owner=owner,
                placement=placement,
                job_type=options["job_type"],
                params=params,
                idempotency_key=options["key"],
                # A shell on the host already holds every power: no second factor here.
                staff=bool(owner.is_staff),
            )
        except ApplicationError as exc:
            details = f" {json.dumps(exc.details)}" if exc.details else ""
            raise CommandError(f"{exc.code}: {exc.message}{details}", returncode=2) from exc
        verb = "created" if created else "exists"
        self.stdout.write(f"{job.id} {job.status} ({verb}, type {job.type}, owner {owner})")


def _owner(username: str | None) -> Any:
    users = get_user_model().objects
    if username:
        owner = users.filter(username=username).first()
        if owner is None:
            raise CommandError(f"No user {username!r}.", returncode=2)
        return owner
    owner = users.filter(is_superuser=True, is_active=True).order_by("pk").first()
    if owner is None:
        raise CommandError("No administrator exists; pass --owner USERNAME.", returncode=2)
    return owner
