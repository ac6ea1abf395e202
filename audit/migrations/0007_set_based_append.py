"""A set-based audit append: the entries of a batch in one statement (issue 38, point 3).

- `audit_append_entries(...)` takes arrays (element i of each is one entry), takes the
  checkpoint barrier once and inserts every entry in one `INSERT ... SELECT FROM unnest`.
- The per-row BEFORE INSERT probe of 0003 (`audit_logs_insert_at_head`) gives way to a
  statement-level AFTER INSERT trigger over the transition table (`audit_new_rows`) that
  checks, in one set-based query, that each chain's new rows continue its head. A
  statement trigger with a transition table also works on a partitioned table.
- The unique (chain, seq) and (chain, prev_hash) constraints stay, checked at commit
  (DEFERRABLE INITIALLY DEFERRED): an immediate unique check would refuse a repeated or
  forked seq during the insert, before the statement trigger could name the row; at
  commit they still refuse what a concurrent appender's uncommitted rows hid from it.
  PostgreSQL cannot make an existing unique constraint deferrable in place, so each is
  dropped and added again (its index is rebuilt under the migration's lock).

The bodies below are frozen copies of audit/sql/append.sql as of this step; the file's
current bodies are installed after migrate (core/sqlfiles.py).
"""

from django.db import migrations, models

FUNCTIONS = """
CREATE OR REPLACE FUNCTION audit_append_entries(
    p_chains text[], p_job_ids uuid[], p_seqs bigint[], p_event_types text[],
    p_actor_types text[], p_actor_ids text[], p_ts timestamptz[], p_payloads text[],
    p_prev_hashes text[]
) RETURNS SETOF audit_logs
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(audit_barrier_key());
    RETURN QUERY
    INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, actor_id, ts,
                            payload, prev_hash, chain_hash)
    SELECT e.chain, e.job_id, e.seq, e.event_type, e.actor_type, e.actor_id, e.ts,
           e.payload, e.prev_hash, audit_chain_hash(e.prev_hash, e.payload)
    FROM unnest(p_chains, p_job_ids, p_seqs, p_event_types, p_actor_types, p_actor_ids,
                p_ts, p_payloads, p_prev_hashes)
         WITH ORDINALITY AS e(chain, job_id, seq, event_type, actor_type, actor_id, ts,
                              payload, prev_hash, n)
    ORDER BY e.n
    RETURNING *;
END;
$$;

CREATE OR REPLACE FUNCTION jobops_audit_continue_heads() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT f.chain, f.seq INTO bad
    FROM (
        SELECT n.chain, n.seq, n.prev_hash,
               lag(n.seq) OVER w AS below_seq, lag(n.chain_hash) OVER w AS below_hash,
               count(*) OVER (PARTITION BY n.chain) AS k
        FROM audit_new_rows n
        WINDOW w AS (PARTITION BY n.chain ORDER BY n.seq, n.id)
    ) AS f
    LEFT JOIN LATERAL (
        SELECT o.seq, o.chain_hash FROM audit_logs o
        WHERE f.below_seq IS NULL AND o.chain = f.chain
        ORDER BY o.seq DESC OFFSET f.k LIMIT 1
    ) AS head ON true
    WHERE CASE
        WHEN f.below_seq IS NOT NULL
            THEN f.seq <> f.below_seq + 1 OR f.prev_hash <> f.below_hash
        WHEN head.seq IS NULL
            THEN f.seq <> 1 OR f.prev_hash <> repeat('0', 64)
        ELSE f.seq <> head.seq + 1 OR f.prev_hash <> head.chain_hash
    END
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'jobops: audit row (%, seq %) does not continue its chain (head seq %)',
            bad.chain, bad.seq,
            (SELECT coalesce(max(o.seq), 0) FROM audit_logs o WHERE o.chain = bad.chain
                AND o.id NOT IN (SELECT n.id FROM audit_new_rows n))
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER audit_logs_insert_at_head ON audit_logs;
DROP FUNCTION jobops_audit_insert_at_head();
CREATE TRIGGER audit_logs_continue_heads AFTER INSERT ON audit_logs
    REFERENCING NEW TABLE AS audit_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobops_audit_continue_heads();
"""

# Back to 0006: the row trigger of 0003, as it was.
REVERSE = """
DROP TRIGGER IF EXISTS audit_logs_continue_heads ON audit_logs;
DROP FUNCTION IF EXISTS jobops_audit_continue_heads();
DROP FUNCTION IF EXISTS audit_append_entries(
    text[], uuid[], bigint[], text[], text[], text[], timestamptz[], text[], text[]);
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


class Migration(migrations.Migration):
    dependencies = [("audit", "0006_actor_types")]

    operations = [
        migrations.RemoveConstraint(model_name="auditlog", name="audit_chain_seq_uniq"),
        migrations.RemoveConstraint(model_name="auditlog", name="audit_chain_prev_uniq"),
        migrations.AddConstraint(
            model_name="auditlog",
            constraint=models.UniqueConstraint(
                deferrable=models.Deferrable.DEFERRED,
                fields=("chain", "seq"),
                name="audit_chain_seq_uniq",
            ),
        ),
        migrations.AddConstraint(
            model_name="auditlog",
            constraint=models.UniqueConstraint(
                deferrable=models.Deferrable.DEFERRED,
                fields=("chain", "prev_hash"),
                name="audit_chain_prev_uniq",
            ),
        ),
        migrations.RunSQL(FUNCTIONS, REVERSE),
    ]
