"""Second factors of portal users (docs/security.md): TOTP devices and static backup tokens.

Devices are made on the host by an administrator (`manage.py otp_enroll`,
`manage.py otp_backup_tokens`, and `bootstrap_admin` for the first one), never in the
portal, which shows no secret (OTP_ADMIN_HIDE_SENSITIVE_DATA).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from typing import Any

import qrcode
from django.db import transaction
from django.utils import timezone
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice


class DeviceExistsError(Exception):
    """The user has a TOTP device already; replacing it must be asked for."""


@transaction.atomic
def totp_device_enroll(*, user: Any, name: str = "phone", replace: bool = False) -> TOTPDevice:
    """A new confirmed TOTP device for `user`.

    A user who has one already keeps it unless `replace` (a lost or new phone): then
    every TOTP device of theirs is deleted in the same transaction, so the old phone's
    codes stop working the moment the new one exists.
    """
    existing = TOTPDevice.objects.filter(user=user)
    if existing.exists():
        if not replace:
            raise DeviceExistsError(f"{user.get_username()} has a TOTP device already")
        existing.delete()
    return TOTPDevice.objects.create(user=user, name=name, confirmed=True)


@transaction.atomic
def backup_tokens_issue(*, user: Any, count: int = 10) -> list[str]:
    """New single-use backup tokens for `user`; the previous ones stop working."""
    device, _ = StaticDevice.objects.get_or_create(
        user=user, name="backup", defaults={"confirmed": True}
    )
    device.token_set.all().delete()
    tokens = [StaticToken.random_token() for _ in range(count)]
    StaticToken.objects.bulk_create(StaticToken(device=device, token=t) for t in tokens)
    return tokens


def verification_wait(devices: Iterable[Any]) -> int | None:
    """Seconds until one of `devices` accepts a code again, or None when one does now.

    django-otp throttles a device after wrong codes (a delay that doubles with each);
    while it does, even the right code is refused. Callers say so, and when to retry,
    instead of calling a correct code wrong.
    """
    waits = []
    for device in devices:
        allowed, extra = device.verify_is_allowed()
        if allowed:
            return None
        locked_until = (extra or {}).get("locked_until")
        seconds = (locked_until - timezone.now()).total_seconds() if locked_until else 1
        waits.append(max(1, math.ceil(seconds)))
    return min(waits) if waits else None


def qr_text(data: str) -> str:
    """`data` as a QR code drawn with text blocks, scannable from a terminal."""
    code = qrcode.QRCode(border=2, error_correction=qrcode.constants.ERROR_CORRECT_M)
    code.add_data(data)
    code.make(fit=True)
    out = io.StringIO()
    # invert: dark modules as spaces on a light background read best on dark terminals
    code.print_ascii(out=out, invert=True)
    return out.getvalue()
