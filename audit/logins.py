"""Portal login lockouts on the ops chain.

django-axes counts failed passwords per username and per address and locks either out
(settings AXES_*). Each lockout and each early unlock is appended to the ops chain, so
an auditor sees who was locked out and who let them back in. The hashed payload names
the user by primary key only: never the typed username (which may be a password typed
into the wrong field, or someone else's name) nor the address.
"""

from __future__ import annotations

from typing import Any

import structlog
from axes.signals import user_locked_out
from axes.utils import reset
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.dispatch import receiver

from audit.services import OPS_CHAIN, Actor, audit_append

log = structlog.get_logger("audit.logins")

LOGIN_THROTTLE = Actor.system("login-throttle")


def _user_id(username: str | None) -> int | None:
    if not username:
        return None
    return (
        get_user_model()
        .objects.filter(**{get_user_model().USERNAME_FIELD: username})
        .values_list("pk", flat=True)
        .first()
    )


# django-axes keeps the typed name in a varchar(255) (AccessAttempt, AccessFailureLog).
AXES_USERNAME_MAX_CHARS = 255


def login_username(request: Any, credentials: dict[str, Any] | None = None) -> str | None:
    """The name django-axes counts a login under (AXES_USERNAME_CALLABLE): what it would
    take itself (the credentials, else the POST), cut to what it can store. The portal's
    login form refuses a longer name before authenticating; this covers any other
    caller of authenticate(), so that a long name is counted, cut, never a 500."""
    field = getattr(settings, "AXES_USERNAME_FORM_FIELD", "username")
    if credentials:
        name = credentials.get(field)
    else:
        name = getattr(request, "data", None) or getattr(request, "POST", {})
        name = name.get(field) if hasattr(name, "get") else None
    if not isinstance(name, str):
        return name
    return name[:AXES_USERNAME_MAX_CHARS]


@receiver(user_locked_out)
def login_lockout_audit(
    sender: Any, request: Any, username: str | None, ip_address: str | None, **kwargs: Any
) -> None:
    """Append `login_locked_out` when a lockout begins.

    axes signals every failure from the limit on (a failure during a lockout restarts
    it); only the one that reaches the limit starts a lockout, so only it is audited.
    """
    failures = getattr(request, "axes_failures_since_start", None)
    if failures != settings.AXES_FAILURE_LIMIT:
        return
    user_id = _user_id(username)
    with transaction.atomic():
        audit_append(
            chain=OPS_CHAIN,
            event_type="login_locked_out",
            actor=LOGIN_THROTTLE,
            data={
                "user_id": user_id,
                "failures": failures,
                "minutes": settings.JOBOPS_LOGIN_LOCKOUT_MINUTES,
            },
        )
    log.warning("login_locked_out", user_id=user_id, failures=failures)


def login_unlock(*, username: str | None = None, ip_address: str | None = None) -> int:
    """End the lockout of a username or of an address now (`manage.py login_unlock`);
    audited `login_unlocked`. Returns how many failure records were cleared (0: nothing
    was locked, and nothing is audited)."""
    if not (username or ip_address):
        raise ValueError("name a username or an address")
    with transaction.atomic():
        cleared = reset(username=username) if username else reset(ip=ip_address)
        if cleared:
            audit_append(
                chain=OPS_CHAIN,
                event_type="login_unlocked",
                actor=Actor.system("manage.py login_unlock"),
                data={
                    "user_id": _user_id(username),
                    "scope": "username" if username else "address",
                },
            )
    return cleared
