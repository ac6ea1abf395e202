"""manage.py check_secret_params: list the recurring schedules whose params hold a secret
(docs/security.md#no-secrets-in-params). Exit 1 when there is any, 0 when none."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs.selectors.schedules import schedules_holding_secrets


class Command(BaseCommand):
    help = (
        "List the recurring schedules whose params hold a secret (a key named in "
        "JOBOPS_SECRET_PARAM_NAMES, or a value shaped like one): their fires are refused "
        "until their params are edited. Prints paths, never values. Exit 1 if any."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        found = schedules_holding_secrets()
        for schedule in found:
            paths = ", ".join(dict.fromkeys(path for path, _ in schedule.paths))
            self.stdout.write(f"{schedule.org_slug}/{schedule.name}\t{schedule.job_type}\t{paths}")
        if found:
            raise CommandError(
                f"{len(found)} schedule(s) hold a secret in their params: replace each by a "
                "reference the worker resolves (manage.py schedule, or the admin).",
                returncode=1,
            )
        self.stdout.write("No schedule holds a secret in its params.")
