"""The chain rule of docs/architecture.md#the-audit-chain as SQL functions, defined once.

Until now `jobs` wrote its own audit rows, with the chain hash, the chain name of a job
and the checkpoint barrier retyped in its statements. These functions are the audit
app's: every append, from a job's transition statement or from `audit.services`, goes
through `audit_append`, the only statement that inserts into audit_logs.

- `audit_job_chain(job_id)`: the chain of a job (`job:<id>`, as audit.services.job_chain);
- `audit_chain_hash(prev_hash, payload)`: sha256(previous head bytes || payload UTF-8),
  hex (as audit.canonical.chain_hash); plain SQL so that the planner inlines both;
- `audit_barrier_key()`: the advisory lock key of the checkpoint barrier, held shared by
  every append and exclusively by a checkpoint (audit.checkpoints);
- `audit_append(...)`: takes the barrier (shared, until commit), inserts the entry with
  its hash, returns the row. The caller decides seq and prev_hash (a job's head lives on
  its row; the ops chain reads it under its chain lock); the insert-at-head trigger
  (0003) still refuses anything that does not continue the chain. It runs as its
  caller (no SECURITY DEFINER): the app role's INSERT grant is what lets it write.
"""

from django.db import migrations

FUNCTIONS = """
CREATE OR REPLACE FUNCTION audit_job_chain(job_id uuid) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'job:' || job_id::text $$;

CREATE OR REPLACE FUNCTION audit_chain_hash(prev_hash text, payload text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT encode(sha256(decode(prev_hash, 'hex') || convert_to(payload, 'UTF8')), 'hex')
$$;

CREATE OR REPLACE FUNCTION audit_barrier_key() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('jobops:audit_checkpoint', 0)
$$;

CREATE OR REPLACE FUNCTION audit_append(
    p_chain text, p_job_id uuid, p_seq bigint, p_event_type text, p_actor_type text,
    p_actor_id text, p_ts timestamptz, p_payload text, p_prev_hash text
) RETURNS audit_logs
LANGUAGE plpgsql AS $$
DECLARE
    entry audit_logs;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(audit_barrier_key());
    INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, actor_id, ts,
                            payload, prev_hash, chain_hash)
    VALUES (p_chain, p_job_id, p_seq, p_event_type, p_actor_type, p_actor_id, p_ts,
            p_payload, p_prev_hash, audit_chain_hash(p_prev_hash, p_payload))
    RETURNING * INTO entry;
    RETURN entry;
END;
$$;
"""

REVERSE = """
DROP FUNCTION IF EXISTS audit_append(text, uuid, bigint, text, text, text, timestamptz, text, text);
DROP FUNCTION IF EXISTS audit_barrier_key();
DROP FUNCTION IF EXISTS audit_chain_hash(text, text);
DROP FUNCTION IF EXISTS audit_job_chain(uuid);
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_insert_at_head")]

    operations = [migrations.RunSQL(FUNCTIONS, REVERSE)]
