-- Future partitions of audit_logs (docs/architecture.md#partitions, audit.partitions).
-- Installed as the owner role (core/sqlfiles.py runs after migrate, as the connection
-- that migrated): the function runs with its owner's rights (SECURITY DEFINER), so the
-- app role, which owns nothing and may only EXECUTE it, gets partitions it can read and
-- insert into through audit_logs and nothing else. EXECUTE is revoked from PUBLIC by
-- audit/migrations/0010 (a replaced body keeps it so) and granted to the app role by
-- manage.py setup_db_roles.


-- Creates, for the current UTC month and the `months_ahead` next ones, each missing
-- partition of both kinds (job: part = the month's first day; ops: its second day),
-- with the append-only triggers a partition needs of its own (TRUNCATE, and the chain
-- continuity check for a direct insert; the UPDATE/DELETE row trigger is cloned from
-- audit_logs on attach) and SELECT only for each role that may read audit_logs (every
-- other privilege, from default privileges or PUBLIC, revoked before the attach).
-- Created standalone and attached: ATTACH PARTITION takes SHARE UPDATE EXCLUSIVE on
-- audit_logs, so appends go on meanwhile (CREATE TABLE ... PARTITION OF would take
-- ACCESS EXCLUSIVE); its CHECK constraint spares the attach a scan. lock_timeout: a
-- long transaction holding the new table's name waits no appender; the caller retries
-- an hour later. Returns how many partitions it created; idempotent.
CREATE OR REPLACE FUNCTION audit_create_partitions() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
SET lock_timeout = '5s' AS $$
DECLARE
    months_ahead CONSTANT integer := 3;
    month date;
    kind text;
    low date;
    name text;
    grantee record;
    created integer := 0;
BEGIN
    FOR i IN 0..months_ahead LOOP
        month := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i))::date;
        FOREACH kind IN ARRAY ARRAY['job', 'ops'] LOOP
            low := CASE kind WHEN 'job' THEN month ELSE month + 1 END;
            name := format('audit_logs_%s_%s', kind, to_char(month, 'YYYY_MM'));
            CONTINUE WHEN EXISTS (
                SELECT FROM pg_inherits
                WHERE inhparent = 'audit_logs'::regclass AND inhrelid = to_regclass(name)
            );
            IF to_regclass(name) IS NULL THEN
                EXECUTE format(
                    'CREATE TABLE %I (LIKE audit_logs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                    name);
                EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (part >= %L AND part < %L)',
                               name, name || '_part', low, low + 1);
                EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT '
                               'EXECUTE FUNCTION jobops_refuse_audit_change()',
                               name || '_no_truncate', name);
                EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %I REFERENCING NEW TABLE AS '
                               'audit_new_rows FOR EACH STATEMENT '
                               'EXECUTE FUNCTION jobops_audit_continue_heads()',
                               name || '_continue_heads', name);
            END IF;
            -- Whatever default privileges granted, each role but the owner keeps SELECT
            -- at most: writes go through audit_logs, whose own grants decide.
            FOR grantee IN
                SELECT DISTINCT a.grantee FROM pg_class c, aclexplode(c.relacl) AS a
                WHERE c.oid = to_regclass(name) AND a.grantee <> c.relowner
            LOOP
                EXECUTE format('REVOKE ALL ON %I FROM %s', name,
                               CASE grantee.grantee WHEN 0 THEN 'PUBLIC'
                                    ELSE grantee.grantee::regrole::text END);
            END LOOP;
            FOR grantee IN
                SELECT DISTINCT a.grantee FROM pg_class c, aclexplode(c.relacl) AS a
                WHERE c.oid = 'audit_logs'::regclass AND a.grantee <> c.relowner
                  AND a.grantee <> 0 AND a.privilege_type = 'SELECT'
            LOOP
                EXECUTE format('GRANT SELECT ON %I TO %s', name, grantee.grantee::regrole::text);
            END LOOP;
            EXECUTE format('ALTER TABLE audit_logs ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           name, low, low + 1);
            created := created + 1;
        END LOOP;
    END LOOP;
    RETURN created;
END;
$$;
