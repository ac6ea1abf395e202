"""`manage.py otp_backup_tokens USERNAME [--count 10]`: new single-use backup tokens.

For a user without their phone: each token opens the portal once, in place of a TOTP
code. Issuing new tokens voids the old ones.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.otp_devices import backup_tokens_issue


class Command(BaseCommand):
    help = "Issue new single-use OTP backup tokens for a user (the old ones stop working)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--count", type=int, default=10, help="how many (1-50, default 10)")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["count"] <= 50:
            raise CommandError("--count must be between 1 and 50")
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        tokens = backup_tokens_issue(user=user, count=options["count"])
        self.stdout.write(
            self.style.SUCCESS(
                f"{len(tokens)} backup tokens for {user.get_username()} (shown once;"
            )
        )
        self.stdout.write("each works once; earlier tokens no longer work):")
        for token in tokens:
            self.stdout.write(f"  {token}")
