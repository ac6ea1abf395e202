from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand
from psycopg import sql


class Command(BaseCommand):
    help = "Create the configured PostgreSQL database if it does not exist yet."

    def handle(self, *args: Any, **options: Any) -> None:
        db = settings.DATABASES["default"]
        conninfo = {
            "host": db.get("HOST") or None,
            "port": db.get("PORT") or None,
            "user": db.get("USER") or None,
            "password": db.get("PASSWORD") or None,
            "dbname": "postgres",
        }
        with psycopg.connect(**{k: v for k, v in conninfo.items() if v}, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
            if exists.fetchone():
                self.stdout.write(f"database {db['NAME']} exists")
                return
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
            self.stdout.write(self.style.SUCCESS(f"created database {db['NAME']}"))
