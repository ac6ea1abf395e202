"""`manage.py otp_enroll USERNAME [--replace]`: give a portal user a TOTP device.

Prints the otpauth:// URI and its QR code once; the user scans it with an authenticator
app (or types the URI's secret) and logs in with password + the app's 6-digit code.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.otp_devices import DeviceExistsError, qr_text, totp_device_enroll


class Command(BaseCommand):
    help = "Enroll a TOTP device for a user and print its provisioning URI and QR code (once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--replace",
            action="store_true",
            help="delete the user's existing TOTP device(s) first (a lost or new phone)",
        )
        parser.add_argument("--name", default="phone", help="the device's name (default: phone)")
        parser.add_argument("--no-qr", action="store_true", help="print the URI only")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        try:
            device = totp_device_enroll(user=user, name=options["name"], replace=options["replace"])
        except DeviceExistsError as exc:
            raise CommandError(f"{exc}; add --replace to replace it") from exc
        self.stdout.write(self.style.SUCCESS(f"TOTP device enrolled for {user.get_username()}."))
        self.stdout.write("Scan the QR code or enter the URI in an authenticator app (shown once):")
        self.stdout.write(f"  {device.config_url}")
        if not options["no_qr"]:
            self.stdout.write(qr_text(device.config_url))
        if not user.is_staff:
            self.stderr.write(f"note: {user.get_username()} is not staff: the portal refuses them")
