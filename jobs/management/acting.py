"""Who acts when an operator control runs from a terminal (`manage.py queue`,
`manage.py connector`)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from audit.services import Actor


def operator_acting(username: str | None) -> tuple[Any, Actor]:
    """The user a command's `--as` names and the actor its audit entries name: that
    operator, or the system's `cli` when none is named. CommandError for a name that is
    no user."""
    if not username:
        return None, Actor.system("cli")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no user {username!r}")
    return user, Actor.operator(user)
