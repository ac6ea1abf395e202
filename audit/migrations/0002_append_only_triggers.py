"""Make audit_logs and audit_checkpoints append-only inside PostgreSQL itself.

Row triggers refuse UPDATE and DELETE; a statement trigger refuses TRUNCATE, which
row triggers never see. They bind the table owner too: only a superuser who
disables user triggers can change history, and checkpoints catch that.
"""

from django.db import migrations

TABLES = ["audit_logs", "audit_checkpoints"]

FUNCTION = """
CREATE OR REPLACE FUNCTION jobops_refuse_audit_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'jobops: % on % refused: audit rows are append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
"""


def _triggers(table: str) -> str:
    return f"""
CREATE TRIGGER {table}_no_update_delete BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION jobops_refuse_audit_change();
CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION jobops_refuse_audit_change();
"""


def _drop(table: str) -> str:
    return f"""
DROP TRIGGER IF EXISTS {table}_no_update_delete ON {table};
DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [
        migrations.RunSQL(
            FUNCTION + "".join(_triggers(t) for t in TABLES),
            "".join(_drop(t) for t in TABLES) + "DROP FUNCTION IF EXISTS jobops_refuse_audit_change();",
        )
    ]
