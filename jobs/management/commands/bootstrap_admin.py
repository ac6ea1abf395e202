from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice


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
        totp = TOTPDevice.objects.create(user=user, name="default", confirmed=True)
        static = StaticDevice.objects.create(user=user, name="backup", confirmed=True)
        tokens = [StaticToken.random_token() for _ in range(6)]
        StaticToken.objects.bulk_create(StaticToken(device=static, token=t) for t in tokens)
        self.stdout.write(self.style.SUCCESS("First administrator created (shown once):"))
        self.stdout.write(f"  username: {user.get_username()}")
        self.stdout.write(f"  password: {password}")
        self.stdout.write(f"  TOTP URI: {totp.config_url}")
        self.stdout.write(f"  backup tokens: {' '.join(tokens)}")
