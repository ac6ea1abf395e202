"""manage.py setup_db_roles --owner ROLE --app ROLE [--apply]

Prints the SQL that makes ROLE(owner) own every table (it runs `migrate`) and gives
ROLE(app) only what web, workers and the dispatcher need: no UPDATE, DELETE or
TRUNCATE on the audit tables, no ownership, no superuser (audit/db_roles.py). With
--apply it runs the SQL on the configured database (as a superuser, once). Give the
roles passwords yourself (`ALTER ROLE ... PASSWORD ...`); none is printed or stored.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from audit.db_roles import role_setup_sql


class Command(BaseCommand):
    help = "Print (or --apply) the SQL for an owner role and a least-privilege app role."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--owner", required=True, help="role that owns the tables")
        parser.add_argument("--app", required=True, help="role the application connects as")
        parser.add_argument("--apply", action="store_true", help="run the SQL now")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["owner"] == options["app"]:
            raise CommandError("--owner and --app must be different roles")
        statements = role_setup_sql(
            owner=options["owner"], app=options["app"], database=connection.settings_dict["NAME"]
        )
        with connection.cursor() as cursor:
            raw = cursor.connection
            texts = [s.as_string(raw) for s in statements]
            if options["apply"]:
                with transaction.atomic():
                    for text in texts:
                        cursor.execute(text)
        for text in texts:
            self.stdout.write(text + ";")
        if options["apply"]:
            self.stderr.write(
                f"Applied. Run migrations as {options['owner']!r}; run web, workers and the "
                f"dispatcher as {options['app']!r} (DATABASE_URL)."
            )
