"""Reads of recurring schedules (docs/operator-controls.md#recurring-schedules)."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.domain.params import params_secrets
from jobs.domain.types import get_type
from jobs.models import Schedule


@dataclass(frozen=True)
class ScheduleSecrets:
    """A schedule whose params hold a secret: its organisation's slug, its name and
    type, and each JSON path with why (never the values)."""

    org_slug: str
    name: str
    job_type: str
    paths: list[tuple[str, str]]


def schedules_holding_secrets() -> list[ScheduleSecrets]:
    """Every schedule whose stored params its next save, and every fire, would refuse as
    holding a secret (jobs.domain.params.params_secrets, under its type's schema): those
    saved before the check existed (`manage.py check_secret_params`). In organisation
    and name order."""
    found = []
    schedules = Schedule.objects.select_related("org").order_by("org__slug", "name")
    for schedule in schedules.iterator(chunk_size=500):
        spec = get_type(schedule.job_type)
        schema = spec.load_params_serializer() if spec is not None else None
        paths = params_secrets(schedule.params, schema=schema)
        if paths:
            found.append(
                ScheduleSecrets(
                    org_slug=schedule.org.slug,
                    name=schedule.name,
                    job_type=schedule.job_type,
                    paths=paths,
                )
            )
    return found
