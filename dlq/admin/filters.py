"""The dead-letter list's filters (state, queue, reason, error code, age, cause), and
the age buckets that the replay and discard pages read the same way."""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from core.admin_filters import ChoicesFilter, InputFilter
from dlq.services.selection import RETRYABLE_REASONS
from jobs.integrations.topology import dlq_names
from jobs.models import DeadLetter, DeadLetterReason, DeadLetterState

# ?age= on the list and the action pages -> (created_after, created_before) offsets.
AGES = {
    "1h": ("last hour", datetime.timedelta(hours=1), None),
    "24h": ("last 24 hours", datetime.timedelta(hours=24), None),
    "7d": ("last 7 days", datetime.timedelta(days=7), None),
    "older7d": ("older than 7 days", None, datetime.timedelta(days=7)),
}


class StateFilter(ChoicesFilter):
    title, parameter_name, field = "state", "state", "state"

    def values(self) -> list[str]:
        return list(DeadLetterState.values)


class DlqFilter(ChoicesFilter):
    title, parameter_name, field = "queue", "queue", "queue"

    def values(self) -> list[str]:
        return dlq_names()


class ReasonFilter(ChoicesFilter):
    title, parameter_name, field = "reason", "reason", "reason"

    def values(self) -> list[str]:
        return list(DeadLetterReason.values)


class ErrorCodeFilter(InputFilter):
    title = "error code"
    parameter_name = "error_code"
    placeholder = "e.g. ERP_500"

    def queryset(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> Any:
        value = (self.value() or "").strip()
        return queryset.filter(error_code=value) if value else queryset


class AgeFilter(admin.SimpleListFilter):
    title = "age"
    parameter_name = "age"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _, _) in AGES.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> Any:
        after, before = age_bounds(self.value())
        if after:
            queryset = queryset.filter(created_at__gte=after)
        if before:
            queryset = queryset.filter(created_at__lt=before)
        return queryset


class RetryableFilter(admin.SimpleListFilter):
    title = "cause"
    parameter_name = "retryable"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("1", "only retryable (replay can cure)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> Any:
        return queryset.filter(reason__in=RETRYABLE_REASONS) if self.value() else queryset


def age_bounds(age: str | None) -> tuple[datetime.datetime | None, datetime.datetime | None]:
    if age not in AGES:
        return None, None
    _, after, before = AGES[age]
    now = timezone.now()
    return (now - after if after else None), (now - before if before else None)
