"""End a portal login lockout now, instead of waiting for it to run out."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.logins import login_unlock


class Command(BaseCommand):
    help = (
        "Clear the failed logins of a username or an address, ending its lockout "
        "(audited on the ops chain as login_unlocked)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", nargs="?", help="the locked-out username")
        parser.add_argument("--ip", dest="ip_address", help="a locked-out client address")

    def handle(self, *args: Any, **options: Any) -> None:
        username, ip_address = options["username"], options["ip_address"]
        if bool(username) == bool(ip_address):
            raise CommandError("Name one username, or one address with --ip.", returncode=2)
        cleared = login_unlock(username=username, ip_address=ip_address)
        who = f"user {username}" if username else f"address {ip_address}"
        if cleared:
            self.stdout.write(f"Unlocked {who} ({cleared} failure record(s) cleared).")
        else:
            self.stdout.write(f"{who} had no failed logins on record; nothing to unlock.")
