"""manage.py purge [--dry-run] [--json] [--older-than DURATION]"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from audit.services import Actor
from core.durations import parse_duration
from jobs.services.purge import (
    kept_lines,
    purge_extras,
    purge_kept,
    purge_preview,
    purge_record,
    purge_run,
)
from jobs.services.purge_force import ForcePurgeRefused, job_force_purge


class Command(BaseCommand):
    help = (
        "Remove the ended jobs past their category's retention, with their artefacts, "
        "closed dead letters and published outbox rows (docs/operations/retention.md); "
        "the dispatcher's purge step does this on its own. --dry-run prints what would go."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="count, remove nothing")
        parser.add_argument("--json", action="store_true", help="print one JSON document")
        parser.add_argument(
            "--older-than",
            metavar="DURATION",
            help="this retention for every category and for bulk operations, this run "
            "only (e.g. 0s, 12h, 30d)",
        )
        parser.add_argument(
            "--force-job",
            metavar="ID",
            help="purge this one job now, before its retention or its idempotency key's "
            "expiry (a straggler: docs/operations/retention.md#stragglers); audited as forced",
        )
        parser.add_argument("--operator", metavar="USERNAME", help="with --force-job: who decides")
        parser.add_argument("--justification", metavar="TEXT", help="with --force-job: why")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["force_job"]:
            self._force(options)
            return
        older_than: timedelta | None = None
        if options["older_than"] is not None:
            try:
                older_than = parse_duration(options["older_than"])
            except ValueError as exc:
                raise CommandError(f"--older-than: {exc}") from exc
        try:
            if options["dry_run"]:
                summary = purge_preview(older_than=older_than)
            else:
                summary, _more = purge_run(older_than=older_than)
                summary.update(purge_extras(older_than=older_than))
            kept = purge_kept(older_than=older_than)
            if not options["dry_run"]:
                purge_record(summary, finished=True, kept=kept)
        except DatabaseError as exc:
            # The database refused a batch (unreachable, or a row purge does not know
            # names a purged one): say so in words; --traceback shows the rest.
            first = (str(exc).strip().splitlines() or [""])[0]
            raise CommandError(
                f"purge stopped: {type(exc).__name__}: {first}. The failing batch removed "
                "nothing; batches before it stay removed."
            ) from exc
        if options["json"]:
            document = {"dry_run": options["dry_run"], **summary, "kept": kept}
            self.stdout.write(json.dumps(document, indent=2))
            return
        verb = "would remove" if options["dry_run"] else "removed"
        jobs = summary.pop("jobs")
        self.stdout.write(f"{verb} {sum(jobs.values())} jobs")
        for category, count in sorted(jobs.items()):
            self.stdout.write(f"  {category}: {count}")
        for kind, count in summary.items():
            self.stdout.write(f"{verb} {count} {kind.replace('_', ' ')}")
        for line in kept_lines(kept):
            self.stdout.write(line)

    def _force(self, options: dict[str, Any]) -> None:
        """--force-job: one straggler, an operator's audited decision."""
        try:
            job_id = uuid.UUID(options["force_job"])
        except ValueError:
            raise CommandError(f"--force-job {options['force_job']!r} is not a job id") from None
        user = get_user_model().objects.filter(username=options["operator"] or "").first()
        if user is None or not user.is_staff:
            raise CommandError("--operator must name a staff user: the decision is theirs")
        try:
            done = job_force_purge(
                job_id=job_id,
                actor=Actor.operator(user),
                justification=options["justification"] or "",
            )
        except ForcePurgeRefused as exc:
            raise CommandError(f"force-purge refused: {exc}") from exc
        self.stdout.write(f"Job {done['job_id']} purged (forced, audited).")
