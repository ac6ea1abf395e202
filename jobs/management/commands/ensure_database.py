from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand
from psycopg import sql
from psycopg.conninfo import make_conninfo

from jobs.queries import QUERIES


class Command(BaseCommand):
    help = "Create the configured PostgreSQL database if it does not exist yet."

    def handle(self, *args: Any, **options: Any) -> None:
        db = settings.DATABASES["default"]
        parts = {"host": db.get("HOST"), "port": db.get("PORT"), "user": db.get("USER")}
        parts["password"] = db.get("PASSWORD")
        conninfo = make_conninfo(dbname="postgres", **{k: str(v) for k, v in parts.items() if v})
        with psycopg.connect(conninfo, autocommit=True) as conn:
            exists = conn.execute(QUERIES["database_exists"], {"name": db["NAME"]})
            if exists.fetchone():
                self.stdout.write(f"database {db['NAME']} exists")
                return
            create = sql.SQL(QUERIES["database_create"])
            conn.execute(create.format(name=sql.Identifier(db["NAME"])))
            self.stdout.write(self.style.SUCCESS(f"created database {db['NAME']}"))
