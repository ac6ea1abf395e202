"""manage.py purge [--dry-run] [--json] [--older-than DURATION]"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from core.durations import parse_duration
from jobs.services.purge import (
    kept_lines,
    purge_extras,
    purge_kept,
    purge_preview,
    purge_record,
    purge_run,
)


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

    def handle(self, *args: Any, **options: Any) -> None:
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
