"""Refuse an audit row that does not continue its chain's head.

Row triggers already refuse UPDATE, DELETE and TRUNCATE. An INSERT could still fork a
chain or plant a row out of order (a seq gap, a wrong prev_hash) that verification would
only find later; this BEFORE INSERT trigger refuses it at once. The head lookup is one
index probe on (chain, seq); appenders of one chain are already serialised by
audit_append's advisory lock, so the head cannot move under it. Rows inserted earlier by
the same statement are visible to the trigger, so a multi-row insert in chain order
passes.
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION jobops_audit_insert_at_head() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    head_seq bigint;
    head_hash text;
BEGIN
    SELECT seq, chain_hash INTO head_seq, head_hash FROM audit_logs
        WHERE chain = NEW.chain ORDER BY seq DESC LIMIT 1;
    IF head_seq IS NULL THEN
        head_seq := 0;
        head_hash := repeat('0', 64);
    END IF;
    IF NEW.seq <> head_seq + 1 OR NEW.prev_hash <> head_hash THEN
        RAISE EXCEPTION 'jobops: audit row (%, seq %) does not continue its chain (head seq %)',
            NEW.chain, NEW.seq, head_seq
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER audit_logs_insert_at_head BEFORE INSERT ON audit_logs
    FOR EACH ROW EXECUTE FUNCTION jobops_audit_insert_at_head();
"""

REVERSE = """
DROP TRIGGER IF EXISTS audit_logs_insert_at_head ON audit_logs;
DROP FUNCTION IF EXISTS jobops_audit_insert_at_head();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only_triggers")]

    operations = [migrations.RunSQL(FUNCTION, REVERSE)]
