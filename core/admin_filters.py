"""Admin list filters that scale: typed values and date ranges instead of Django's
"pick from every distinct value" lists, which cost a DISTINCT over the whole table."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date


class InputFilter(admin.SimpleListFilter):
    """A text box: `?<parameter_name>=value`; subclasses say what the value matches."""

    template = "admin/jobops/input_filter.html"
    placeholder = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, Any]]:
        return [("", "")]  # one (hidden) choice, so that the filter is shown

    def choices(self, changelist: Any) -> Iterator[Any]:
        name = str(self.parameter_name)
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[name]),
            "hidden": _other_params(changelist, {name}),
        }


class DateRangeFilter(admin.ListFilter):
    """From/to dates on one field: `?<field>_from=YYYY-MM-DD&<field>_to=YYYY-MM-DD`
    (to is inclusive). A value that is no date is ignored."""

    template = "admin/jobops/date_range_filter.html"
    field_name = "created_at"

    def __init__(self, request: HttpRequest, params: dict[str, Any], model: Any, model_admin: Any):
        super().__init__(request, params, model, model_admin)
        for name in self.expected_parameters():
            if name in params:
                value = params.pop(name)
                self.used_parameters[name] = value[-1] if isinstance(value, list) else value

    def expected_parameters(self) -> list[str | None]:
        return [f"{self.field_name}_from", f"{self.field_name}_to"]

    def has_output(self) -> bool:
        return True

    def _date(self, name: str | None) -> datetime.date | None:
        try:
            return parse_date(str(self.used_parameters.get(str(name)) or ""))
        except ValueError:
            return None

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        from_name, to_name = self.expected_parameters()
        start, end = self._date(from_name), self._date(to_name)
        if start:
            queryset = queryset.filter(**{f"{self.field_name}__gte": _midnight(start)})
        if end:
            day_after = end + datetime.timedelta(days=1)
            queryset = queryset.filter(**{f"{self.field_name}__lt": _midnight(day_after)})
        return queryset

    def choices(self, changelist: Any) -> Iterator[Any]:
        names = [str(n) for n in self.expected_parameters()]
        yield {
            "selected": not any(self.used_parameters.get(n) for n in names),
            "query_string": changelist.get_query_string(remove=names),
            "hidden": _other_params(changelist, set(names)),
            "from_name": names[0],
            "to_name": names[1],
            "from_value": self.used_parameters.get(names[0]) or "",
            "to_value": self.used_parameters.get(names[1]) or "",
        }


def _midnight(day: datetime.date) -> datetime.datetime:
    return datetime.datetime.combine(day, datetime.time.min, tzinfo=timezone.get_current_timezone())


def _other_params(changelist: Any, own: set[str]) -> list[tuple[str, str]]:
    """The query string's other filters, to carry in a filter's own little form."""
    hidden = []
    for key, value in changelist.get_filters_params().items():
        if key in own:
            continue
        for item in value if isinstance(value, list) else [value]:
            hidden.append((key, item))
    for key in ("q", "o"):
        if key in changelist.params:
            hidden.append((key, changelist.params[key]))
    return hidden
