from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from core.otp_devices import backup_tokens_issue, qr_text, totp_device_enroll


class Command(BaseCommand):
    help = (
        "Create the first operator (staff + superuser) with a TOTP device and backup tokens, "
        "printing the password, the TOTP provisioning URI and the tokens once. "
        "Does nothing when a superuser already exists."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--email", default="admin@localhost")

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        if user_model.objects.filter(is_superuser=True).exists():
            self.stdout.write("an administrator exists already; nothing to do")
            return
        password = secrets.token_urlsafe(16)
        user = user_model.objects.create_superuser(
            username=options["username"], email=options["email"], password=password
        )
        totp = totp_device_enroll(user=user, name="default")
        tokens = backup_tokens_issue(user=user, count=6)
        self.stdout.write(self.style.SUCCESS("First administrator created (shown once):"))
        self.stdout.write(f"  username: {user.get_username()}")
        self.stdout.write(f"  password: {password}")
        self.stdout.write(f"  TOTP URI: {totp.config_url}")
        self.stdout.write(qr_text(totp.config_url))
        self.stdout.write(f"  backup tokens: {' '.join(tokens)}")
