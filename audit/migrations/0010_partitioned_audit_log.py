"""A partitioned audit log (issue 42, point 1): docs/operations/upgrading.md.

audit_logs becomes a table partitioned by RANGE on `part` (audit.partitions), by
attaching, not copying: the table as it is becomes the partition `audit_logs_legacy`
(part = 1970-01-01, every row from before this step) of a new partitioned parent
`audit_logs`. Not atomic: each step is its own transaction, so that the unique indexes
of the new keys are built CONCURRENTLY (appends go on) and only the cut-over holds
audit_logs exclusively, for the time a few catalogue changes take (no scan, no build):

1. `part` with the constant default 1970-01-01 (metadata only, no rewrite);
2. CHECK (part = '1970-01-01') NOT VALID, then VALIDATE (a scan that blocks no
   append), so that the attach need not scan;
3. the unique indexes (id, part), (chain, seq, part), (chain, prev_hash, part),
   CREATE UNIQUE INDEX CONCURRENTLY;
4. the cut-over, one transaction: the new indexes become the legacy table's primary
   key and unique constraints (USING INDEX), the identity moves from the legacy table
   to the parent (starting after the highest id ever handed out: ids keep going), the
   table is renamed `audit_logs_legacy`, the parent created and the legacy table
   attached, the parent's other indexes matched to the legacy table's (no build), the
   triggers and grants set on the parent, the append functions replaced (their row type
   is the parent's now);
   and the current month's and the next three months' partitions created
   (`audit_create_partitions()`), so that the first append after the commit finds
   its partition; from then on a new job's audit_part defaults to its month;
5. `audit_create_partitions()` again (nothing to do: a re-run's safety), and the
   append functions the cut-over renamed (rather than dropped, so that a call waiting
   for its lock succeeds) are dropped, with the parent's default part that such a call
   needed (every writer names its part from then on).

A step that failed can be run again: each is idempotent (IF NOT EXISTS; a failed
CONCURRENTLY build leaves an INVALID index, which step 3 drops and builds again).

The SQL function bodies below are frozen copies of audit/sql/append.sql and
audit/sql/partitions.sql as of this step (core/sqlfiles.py installs the current ones
after migrate).
"""

from django.db import migrations, models

APPEND_0009_SQL = r"""-- The chain rule of docs/architecture.md#the-audit-chain as SQL functions: the current
-- bodies (core/sqlfiles.py installs them after every migrate; a migration that needs one
-- at its own step carries a frozen copy). Every insert into audit_logs goes through
-- audit_append_entries (a batch, one statement), audit_append_job_entries (a batch of
-- job chains' entries of one change) or audit_append (one entry, kept for the processes
-- of the previous release during a rolling upgrade).


-- The chain of a job (`job:<id>`, as audit.services.job_chain).
CREATE OR REPLACE FUNCTION audit_job_chain(job_id uuid) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'job:' || job_id::text $$;


-- sha256(previous head bytes || payload UTF-8), hex (audit.canonical.chain_hash); plain
-- SQL so that the planner inlines it.
CREATE OR REPLACE FUNCTION audit_chain_hash(prev_hash text, payload text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT encode(sha256(decode(prev_hash, 'hex') || convert_to(payload, 'UTF8')), 'hex')
$$;


-- The advisory lock key of the checkpoint barrier: held shared by every append (until
-- commit) and exclusively by a checkpoint (audit.checkpoints).
CREATE OR REPLACE FUNCTION audit_barrier_key() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('jobops:audit_checkpoint', 0)
$$;


-- Appends the entries of a whole batch in one INSERT: element i of every array is one
-- entry. Takes the checkpoint barrier once (shared, until commit), hashes each entry
-- with its prev_hash and inserts them in array order, returning the rows as audit_logs
-- holds them (in that order). The caller decides seq and prev_hash (a job's head lives
-- on its row; other chains read theirs under their chain lock); the statement trigger
-- jobops_audit_continue_heads refuses anything that does not continue its chain. Runs
-- as its caller (no SECURITY DEFINER): the app role's INSERT grant lets it write.
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


-- audit_append_entries for the entries of job chains that one change of a batch of jobs
-- writes (jobs/sql/20_transitions.sql): one job's entry per element, all of one event,
-- actor and time. Returns how many were appended. The same barrier, hash and trigger;
-- written for the common case of a one-job transition, where audit_append_entries'
-- arrays of repeated values, its returned rows and its own call were about a quarter
-- of what the entry cost the database.
CREATE OR REPLACE FUNCTION audit_append_job_entries(
    p_job_ids uuid[], p_seqs bigint[], p_payloads text[], p_prev_hashes text[],
    p_event_type text, p_actor_type text, p_actor_id text, p_ts timestamptz
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    appended bigint;
BEGIN
    IF cardinality(p_job_ids) IS NULL THEN  -- no change: a caller's array_agg of no rows
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(audit_barrier_key());
    INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, actor_id, ts,
                            payload, prev_hash, chain_hash)
    SELECT audit_job_chain(e.job_id), e.job_id, e.seq, p_event_type, p_actor_type,
           p_actor_id, p_ts, e.payload, e.prev_hash, audit_chain_hash(e.prev_hash, e.payload)
    FROM unnest(p_job_ids, p_seqs, p_payloads, p_prev_hashes)
         WITH ORDINALITY AS e(job_id, seq, payload, prev_hash, n)
    ORDER BY e.n;
    GET DIAGNOSTICS appended = ROW_COUNT;
    RETURN appended;
END;
$$;


-- One entry (the previous release's writer, kept one release for a rolling upgrade:
-- docs/operations/upgrading.md).
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


-- The statement trigger (AFTER INSERT, transition table audit_new_rows) that refuses
-- rows which do not continue their chain's head, in one set-based query. Per chain, the
-- new rows sorted by seq must be consecutive, each linking to the one before it; the
-- first (seq m of k new rows) must follow the old head. One backward probe of the
-- (chain, seq) index per chain finds that head: the row k places below the chain's top.
-- It is the old head only if the top k rows are exactly the new ones, so it must have
-- seq m - 1 and the first row's prev_hash as its hash (no such row: the chain was empty,
-- m = 1 and prev_hash is the genesis hash). The unique (chain, seq) and (chain,
-- prev_hash) constraints are checked at commit (deferred): they catch what no statement
-- can see, a concurrent appender's uncommitted rows, and let this trigger name the
-- refused row first.
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
"""

APPEND_SQL = r"""-- The chain rule of docs/architecture.md#the-audit-chain as SQL functions: the current
-- bodies (core/sqlfiles.py installs them after every migrate; a migration that needs one
-- at its own step carries a frozen copy). Every insert into audit_logs goes through
-- audit_append_entries (a batch, one statement), audit_append_job_entries (a batch of
-- job chains' entries of one change) or audit_append (one entry, kept for the processes
-- of the previous release during a rolling upgrade).


-- The chain of a job (`job:<id>`, as audit.services.job_chain).
CREATE OR REPLACE FUNCTION audit_job_chain(job_id uuid) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'job:' || job_id::text $$;


-- The partition key of an entry (docs/architecture.md#partitions, audit.partitions): a
-- job chain's is the first day of the UTC month of its job's created_at (kept on the
-- job row, jobs.audit_part, so that every entry of the chain lands in one partition);
-- every other chain's is the second day of the UTC month of the entry's ts, so that the
-- ops chain has partitions of its own while `part` stays one date column.
CREATE OR REPLACE FUNCTION audit_part_for_job(created_at timestamptz) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc('month', created_at AT TIME ZONE 'UTC')::date
$$;

CREATE OR REPLACE FUNCTION audit_part_for_other(ts timestamptz) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc('month', ts AT TIME ZONE 'UTC')::date + 1
$$;


-- The part of an entry written through audit_append_entries or audit_append: a job
-- chain's from its job row (the previous release's job create calls audit_append; a job
-- row already gone falls back to the entry's month), any other chain's from its ts.
CREATE OR REPLACE FUNCTION audit_entry_part(p_chain text, p_job_id uuid, p_ts timestamptz)
RETURNS date
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found_part date;
BEGIN
    IF NOT starts_with(p_chain, 'job:') THEN
        RETURN audit_part_for_other(p_ts);
    END IF;
    SELECT j.audit_part INTO found_part FROM jobs j WHERE j.id = p_job_id;
    RETURN coalesce(found_part, audit_part_for_job(p_ts));
END;
$$;


-- sha256(previous head bytes || payload UTF-8), hex (audit.canonical.chain_hash); plain
-- SQL so that the planner inlines it.
CREATE OR REPLACE FUNCTION audit_chain_hash(prev_hash text, payload text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT encode(sha256(decode(prev_hash, 'hex') || convert_to(payload, 'UTF8')), 'hex')
$$;


-- The advisory lock key of the checkpoint barrier: held shared by every append (until
-- commit) and exclusively by a checkpoint (audit.checkpoints).
CREATE OR REPLACE FUNCTION audit_barrier_key() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('jobops:audit_checkpoint', 0)
$$;


-- Appends the entries of a whole batch in one INSERT: element i of every array is one
-- entry. Takes the checkpoint barrier once (shared, until commit), hashes each entry
-- with its prev_hash and inserts them in array order, returning the rows as audit_logs
-- holds them (in that order). The caller decides seq and prev_hash (a job's head lives
-- on its row; other chains read theirs under their chain lock); the statement trigger
-- jobops_audit_continue_heads refuses anything that does not continue its chain. Runs
-- as its caller (no SECURITY DEFINER): the app role's INSERT grant lets it write.
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
                            payload, prev_hash, chain_hash, part)
    SELECT e.chain, e.job_id, e.seq, e.event_type, e.actor_type, e.actor_id, e.ts,
           e.payload, e.prev_hash, audit_chain_hash(e.prev_hash, e.payload),
           audit_entry_part(e.chain, e.job_id, e.ts)
    FROM unnest(p_chains, p_job_ids, p_seqs, p_event_types, p_actor_types, p_actor_ids,
                p_ts, p_payloads, p_prev_hashes)
         WITH ORDINALITY AS e(chain, job_id, seq, event_type, actor_type, actor_id, ts,
                              payload, prev_hash, n)
    ORDER BY e.n
    RETURNING *;
END;
$$;


-- audit_append_entries for the entries of job chains that one change of a batch of jobs
-- writes (jobs/sql/20_transitions.sql): one job's entry per element, all of one event,
-- actor and time, each in its job's partition (`p_parts`: jobs.audit_part). Returns how
-- many were appended. The same barrier, hash and trigger; written for the common case of
-- a one-job transition, where audit_append_entries' arrays of repeated values, its
-- returned rows and its own call were about a quarter of what the entry cost the
-- database.
CREATE OR REPLACE FUNCTION audit_append_job_entries(
    p_job_ids uuid[], p_parts date[], p_seqs bigint[], p_payloads text[],
    p_prev_hashes text[], p_event_type text, p_actor_type text, p_actor_id text,
    p_ts timestamptz
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    appended bigint;
BEGIN
    IF cardinality(p_job_ids) IS NULL THEN  -- no change: a caller's array_agg of no rows
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(audit_barrier_key());
    INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, actor_id, ts,
                            payload, prev_hash, chain_hash, part)
    SELECT audit_job_chain(e.job_id), e.job_id, e.seq, p_event_type, p_actor_type,
           p_actor_id, p_ts, e.payload, e.prev_hash, audit_chain_hash(e.prev_hash, e.payload),
           e.part
    FROM unnest(p_job_ids, p_parts, p_seqs, p_payloads, p_prev_hashes)
         WITH ORDINALITY AS e(job_id, part, seq, payload, prev_hash, n)
    ORDER BY e.n;
    GET DIAGNOSTICS appended = ROW_COUNT;
    RETURN appended;
END;
$$;


-- The same without parts (the signature before the partitioned log, kept one release
-- for a rolling upgrade): each job's part read from its row.
CREATE OR REPLACE FUNCTION audit_append_job_entries(
    p_job_ids uuid[], p_seqs bigint[], p_payloads text[], p_prev_hashes text[],
    p_event_type text, p_actor_type text, p_actor_id text, p_ts timestamptz
) RETURNS bigint
LANGUAGE sql AS $$
    SELECT audit_append_job_entries(
        p_job_ids,
        ARRAY(SELECT audit_entry_part(audit_job_chain(u.id), u.id, p_ts)
              FROM unnest(p_job_ids) WITH ORDINALITY AS u(id, n) ORDER BY u.n),
        p_seqs, p_payloads, p_prev_hashes, p_event_type, p_actor_type, p_actor_id, p_ts
    )
$$;


-- One entry (the previous release's writer, kept one release for a rolling upgrade:
-- docs/operations/upgrading.md).
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
                            payload, prev_hash, chain_hash, part)
    VALUES (p_chain, p_job_id, p_seq, p_event_type, p_actor_type, p_actor_id, p_ts,
            p_payload, p_prev_hash, audit_chain_hash(p_prev_hash, p_payload),
            audit_entry_part(p_chain, p_job_id, p_ts))
    RETURNING * INTO entry;
    RETURN entry;
END;
$$;


-- The statement trigger (AFTER INSERT, transition table audit_new_rows) that refuses
-- rows which do not continue their chain's head, in one set-based query. Per chain, the
-- new rows sorted by seq must be consecutive, each linking to the one before it; the
-- first (seq m of k new rows) must follow the old head. One backward probe of the
-- (chain, seq) index per chain finds that head: the row k places below the chain's top.
-- It is the old head only if the top k rows are exactly the new ones, so it must have
-- seq m - 1 and the first row's prev_hash as its hash (no such row: the chain was empty,
-- m = 1 and prev_hash is the genesis hash). The probe is bounded by `part`: a job
-- chain lives in its one partition (the probe prunes to it); any other chain's older
-- entries are in partitions at or below the new row's. The unique (chain, seq) and (chain,
-- prev_hash) constraints are checked at commit (deferred): they catch what no statement
-- can see, a concurrent appender's uncommitted rows, and let this trigger name the
-- refused row first.
CREATE OR REPLACE FUNCTION jobops_audit_continue_heads() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT f.chain, f.seq INTO bad
    FROM (
        SELECT n.chain, n.seq, n.prev_hash, n.part,
               lag(n.seq) OVER w AS below_seq, lag(n.chain_hash) OVER w AS below_hash,
               count(*) OVER (PARTITION BY n.chain) AS k
        FROM audit_new_rows n
        WINDOW w AS (PARTITION BY n.chain ORDER BY n.seq, n.id)
    ) AS f
    LEFT JOIN LATERAL (
        SELECT o.seq, o.chain_hash FROM audit_logs o
        WHERE f.below_seq IS NULL AND o.chain = f.chain AND o.part <= f.part
          AND o.part >= CASE WHEN starts_with(f.chain, 'job:') THEN f.part
                             ELSE '-infinity'::date END
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
"""

PARTITIONS_SQL = r"""-- Future partitions of audit_logs (docs/architecture.md#partitions, audit.partitions).
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
"""

ADD_PART = "ALTER TABLE audit_logs ADD COLUMN IF NOT EXISTS part date NOT NULL DEFAULT '1970-01-01'"

ADD_CHECK = """
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'audit_logs_legacy_part') THEN
        ALTER TABLE audit_logs ADD CONSTRAINT audit_logs_legacy_part
            CHECK (part = '1970-01-01') NOT VALID;
    END IF;
END $$
"""

VALIDATE_CHECK = "ALTER TABLE audit_logs VALIDATE CONSTRAINT audit_logs_legacy_part"

# (index, columns): built concurrently on the table that becomes audit_logs_legacy.
INDEXES = [
    ("audit_logs_legacy_pkey", "id, part"),
    ("audit_logs_legacy_chain_seq_part", "chain, seq, part"),
    ("audit_logs_legacy_chain_prev_part", "chain, prev_hash, part"),
]


def drop_invalid(name: str) -> str:
    return f"""
DO $$ BEGIN
    IF EXISTS (SELECT FROM pg_index WHERE indexrelid = to_regclass('{name}')
               AND NOT indisvalid) THEN
        EXECUTE 'DROP INDEX {name}';
    END IF;
END $$
"""


def build(name: str, columns: str) -> str:
    return f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {name} ON audit_logs ({columns})"


CUT_OVER = """
LOCK TABLE audit_logs IN ACCESS EXCLUSIVE MODE;

ALTER TABLE audit_logs
    DROP CONSTRAINT audit_logs_pkey,
    ADD CONSTRAINT audit_logs_legacy_pkey PRIMARY KEY USING INDEX audit_logs_legacy_pkey,
    DROP CONSTRAINT audit_chain_seq_uniq,
    ADD CONSTRAINT audit_logs_legacy_chain_seq_part UNIQUE
        USING INDEX audit_logs_legacy_chain_seq_part DEFERRABLE INITIALLY DEFERRED,
    DROP CONSTRAINT audit_chain_prev_uniq,
    ADD CONSTRAINT audit_logs_legacy_chain_prev_part UNIQUE
        USING INDEX audit_logs_legacy_chain_prev_part DEFERRABLE INITIALLY DEFERRED;
ALTER INDEX audit_ts_idx RENAME TO audit_logs_legacy_ts_idx;
ALTER INDEX audit_logs_job_id_8697fc42 RENAME TO audit_logs_legacy_job_id_idx;
ALTER INDEX audit_annotated_target_idx RENAME TO audit_logs_legacy_annotated_idx;
ALTER TABLE audit_logs ALTER COLUMN part DROP DEFAULT;

-- The identity moves to the parent, starting after the highest id ever handed out.
CREATE TEMPORARY TABLE audit_next_id ON COMMIT DROP AS
    SELECT greatest(nextval(pg_get_serial_sequence('audit_logs', 'id')),
                    (SELECT coalesce(max(id), 0) + 1 FROM audit_logs)) AS id;
ALTER TABLE audit_logs ALTER COLUMN id DROP IDENTITY;

ALTER TABLE audit_logs RENAME TO audit_logs_legacy;
ALTER TRIGGER audit_logs_no_truncate ON audit_logs_legacy RENAME TO audit_logs_legacy_no_truncate;
ALTER TRIGGER audit_logs_continue_heads ON audit_logs_legacy
    RENAME TO audit_logs_legacy_continue_heads;
-- The parent's row trigger is cloned onto it at the attach.
DROP TRIGGER audit_logs_no_update_delete ON audit_logs_legacy;

CREATE TABLE audit_logs (
    id bigint NOT NULL GENERATED BY DEFAULT AS IDENTITY,
    chain varchar(64) NOT NULL,
    job_id uuid,
    seq bigint NOT NULL,
    event_type varchar(32) NOT NULL,
    actor_type varchar(16) NOT NULL,
    actor_id varchar(64) NOT NULL,
    ts timestamptz NOT NULL,
    payload text NOT NULL,
    prev_hash varchar(64) NOT NULL,
    chain_hash varchar(64) NOT NULL,
    -- The default only for the appends already under way at the cut-over (the legacy
    -- table's: it is where they belong); dropped by the next step.
    part date NOT NULL DEFAULT '1970-01-01',
    CONSTRAINT audit_logs_pkey PRIMARY KEY (id, part),
    CONSTRAINT audit_chain_seq_part_uniq UNIQUE (chain, seq, part)
        DEFERRABLE INITIALLY DEFERRED,
    CONSTRAINT audit_chain_prev_part_uniq UNIQUE (chain, prev_hash, part)
        DEFERRABLE INITIALLY DEFERRED,
    CONSTRAINT audit_seq_positive CHECK (seq >= 1)
) PARTITION BY RANGE (part);
DO $$ BEGIN
    EXECUTE format('ALTER TABLE audit_logs ALTER COLUMN id RESTART WITH %s',
                   (SELECT id FROM audit_next_id));
END $$;

ALTER TABLE audit_logs ATTACH PARTITION audit_logs_legacy
    FOR VALUES FROM (MINVALUE) TO ('1970-01-02');

-- Each matches the legacy table's index of the same definition (attached, not built).
CREATE INDEX audit_ts_idx ON audit_logs (ts);
CREATE INDEX audit_logs_job_id_8697fc42 ON audit_logs (job_id);
CREATE INDEX audit_annotated_target_idx ON audit_logs
    (((payload::jsonb -> 'data') ->> 'target_job_id')) WHERE event_type = 'annotated';

CREATE TRIGGER audit_logs_no_update_delete BEFORE UPDATE OR DELETE ON audit_logs
    FOR EACH ROW EXECUTE FUNCTION jobops_refuse_audit_change();
CREATE TRIGGER audit_logs_no_truncate BEFORE TRUNCATE ON audit_logs
    FOR EACH STATEMENT EXECUTE FUNCTION jobops_refuse_audit_change();

-- Their row type was the table renamed: replaced by ones that return the parent's.
-- Renamed, not dropped: a call already under way (waiting for this lock) goes on with
-- the function it resolved and succeeds (the parent's rows have the legacy table's
-- columns); a drop would fail it. Dropped by the next step.
ALTER FUNCTION audit_append_entries(text[], uuid[], bigint[], text[], text[], text[],
                                    timestamptz[], text[], text[])
    RENAME TO audit_append_entries_before_0010;
ALTER FUNCTION audit_append(text, uuid, bigint, text, text, text, timestamptz, text, text)
    RENAME TO audit_append_before_0010;
""" + APPEND_SQL + """
CREATE TRIGGER audit_logs_continue_heads AFTER INSERT ON audit_logs
    REFERENCING NEW TABLE AS audit_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobops_audit_continue_heads();

-- The grants move with the name: what a role had on the table it has on the parent;
-- on the legacy partition, SELECT at most (writes go through the parent).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, a.privilege_type
        FROM pg_class c, aclexplode(c.relacl) AS a
        WHERE c.oid = 'audit_logs_legacy'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON audit_logs TO %s', g.privilege_type,
                       CASE g.grantee WHEN 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
        IF g.privilege_type <> 'SELECT' THEN
            EXECUTE format('REVOKE %s ON audit_logs_legacy FROM %s', g.privilege_type,
                           CASE g.grantee WHEN 0 THEN 'PUBLIC'
                                ELSE g.grantee::regrole::text END);
        END IF;
        IF g.privilege_type = 'INSERT' AND g.grantee <> 0 THEN
            EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %s TO %s',
                           pg_get_serial_sequence('audit_logs', 'id'), g.grantee::regrole::text);
        END IF;
    END LOOP;
END $$;
""" + PARTITIONS_SQL + """
REVOKE ALL ON FUNCTION audit_create_partitions() FROM PUBLIC;

-- The role that may append (the app role) may create partitions, and nothing more.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee FROM pg_class c, aclexplode(c.relacl) AS a
        WHERE c.oid = 'audit_logs'::regclass AND a.grantee NOT IN (0, c.relowner)
          AND a.privilege_type = 'INSERT'
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION audit_create_partitions() TO %s',
                       g.grantee::regrole::text);
    END LOOP;
END $$;

-- From now on a new job's chain goes to the partition of its month: a job created
-- before this commit (its chain begun in the legacy table) keeps 1970-01-01.
ALTER TABLE jobs ALTER COLUMN audit_part
    SET DEFAULT date_trunc('month', now() AT TIME ZONE 'UTC')::date;

-- In the same transaction: the first append after the commit needs its partition.
SELECT audit_create_partitions();
"""

CREATE_PARTITIONS = "SELECT audit_create_partitions()"

DROP_RENAMED = """
ALTER TABLE audit_logs ALTER COLUMN part DROP DEFAULT;
DROP FUNCTION IF EXISTS audit_append_entries_before_0010(
    text[], uuid[], bigint[], text[], text[], text[], timestamptz[], text[], text[]);
DROP FUNCTION IF EXISTS audit_append_before_0010(
    text, uuid, bigint, text, text, text, timestamptz, text, text);
"""

# Back to one table (a migration test's round trip; a real downgrade copies every row
# written since the cut-over into the legacy table, which becomes audit_logs again).
CUT_OVER_UNDO = """
LOCK TABLE audit_logs IN ACCESS EXCLUSIVE MODE;
ALTER TABLE jobs ALTER COLUMN audit_part SET DEFAULT '1970-01-01';
CREATE TEMPORARY TABLE audit_next_id ON COMMIT DROP AS
    SELECT greatest(nextval(pg_get_serial_sequence('audit_logs', 'id')),
                    (SELECT coalesce(max(id), 0) + 1 FROM audit_logs)) AS id;
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, a.privilege_type
        FROM pg_class c, aclexplode(c.relacl) AS a
        WHERE c.oid = 'audit_logs'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON audit_logs_legacy TO %s', g.privilege_type,
                       CASE g.grantee WHEN 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
    END LOOP;
END $$;
ALTER TABLE audit_logs DETACH PARTITION audit_logs_legacy;
ALTER TABLE audit_logs_legacy DROP CONSTRAINT audit_logs_legacy_part;
ALTER TABLE audit_logs_legacy DISABLE TRIGGER audit_logs_legacy_continue_heads;
INSERT INTO audit_logs_legacy SELECT * FROM audit_logs WHERE part > '1970-01-01'
    ORDER BY chain, seq;
ALTER TABLE audit_logs_legacy ENABLE TRIGGER audit_logs_legacy_continue_heads;
DROP FUNCTION audit_append_entries(text[], uuid[], bigint[], text[], text[], text[],
                                   timestamptz[], text[], text[]);
DROP FUNCTION audit_append(text, uuid, bigint, text, text, text, timestamptz, text, text);
DROP FUNCTION audit_append_job_entries(uuid[], date[], bigint[], text[], text[], text,
                                       text, text, timestamptz);
DROP FUNCTION audit_create_partitions();
DROP TABLE audit_logs;
DROP FUNCTION audit_entry_part(text, uuid, timestamptz);
DROP FUNCTION audit_part_for_job(timestamptz);
DROP FUNCTION audit_part_for_other(timestamptz);
ALTER TABLE audit_logs_legacy RENAME TO audit_logs;
ALTER TRIGGER audit_logs_legacy_no_truncate ON audit_logs RENAME TO audit_logs_no_truncate;
ALTER TRIGGER audit_logs_legacy_continue_heads ON audit_logs RENAME TO audit_logs_continue_heads;
DROP TRIGGER IF EXISTS audit_logs_no_update_delete ON audit_logs;
CREATE TRIGGER audit_logs_no_update_delete BEFORE UPDATE OR DELETE ON audit_logs
    FOR EACH ROW EXECUTE FUNCTION jobops_refuse_audit_change();
ALTER TABLE audit_logs
    DROP CONSTRAINT audit_logs_legacy_pkey,
    DROP CONSTRAINT audit_logs_legacy_chain_seq_part,
    DROP CONSTRAINT audit_logs_legacy_chain_prev_part,
    DROP COLUMN part,
    ADD CONSTRAINT audit_logs_pkey PRIMARY KEY (id),
    ADD CONSTRAINT audit_chain_seq_uniq UNIQUE (chain, seq) DEFERRABLE INITIALLY DEFERRED,
    ADD CONSTRAINT audit_chain_prev_uniq UNIQUE (chain, prev_hash)
        DEFERRABLE INITIALLY DEFERRED;
ALTER INDEX audit_logs_legacy_ts_idx RENAME TO audit_ts_idx;
ALTER INDEX audit_logs_legacy_job_id_idx RENAME TO audit_logs_job_id_8697fc42;
ALTER INDEX audit_logs_legacy_annotated_idx RENAME TO audit_annotated_target_idx;
ALTER TABLE audit_logs ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY;
DO $$ BEGIN
    EXECUTE format('ALTER TABLE audit_logs ALTER COLUMN id RESTART WITH %s',
                   (SELECT id FROM audit_next_id));
END $$;
""" + APPEND_0009_SQL


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run in a transaction: each operation commits alone.
    atomic = False

    dependencies = [("audit", "0009_annotated"), ("jobs", "0029_job_audit_part")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(ADD_PART, "ALTER TABLE audit_logs DROP COLUMN IF EXISTS part"),
                migrations.RunSQL(
                    ADD_CHECK,
                    "ALTER TABLE audit_logs DROP CONSTRAINT IF EXISTS audit_logs_legacy_part",
                ),
                migrations.RunSQL(VALIDATE_CHECK, migrations.RunSQL.noop),
                *(
                    op
                    for name, columns in INDEXES
                    for op in (
                        migrations.RunSQL(drop_invalid(name), migrations.RunSQL.noop),
                        migrations.RunSQL(build(name, columns), f"DROP INDEX IF EXISTS {name}"),
                    )
                ),
                migrations.RunSQL(CUT_OVER, CUT_OVER_UNDO),
                migrations.RunSQL(CREATE_PARTITIONS, migrations.RunSQL.noop),
                migrations.RunSQL(DROP_RENAMED, migrations.RunSQL.noop),
            ],
            state_operations=[
                migrations.AddField(
                    model_name="auditlog", name="part", field=models.DateField()
                ),
                migrations.RemoveConstraint(model_name="auditlog", name="audit_chain_seq_uniq"),
                migrations.RemoveConstraint(model_name="auditlog", name="audit_chain_prev_uniq"),
                migrations.AddConstraint(
                    model_name="auditlog",
                    constraint=models.UniqueConstraint(
                        deferrable=models.Deferrable.DEFERRED,
                        fields=("chain", "seq", "part"),
                        name="audit_chain_seq_part_uniq",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="auditlog",
                    constraint=models.UniqueConstraint(
                        deferrable=models.Deferrable.DEFERRED,
                        fields=("chain", "prev_hash", "part"),
                        name="audit_chain_prev_part_uniq",
                    ),
                ),
            ],
        )
    ]
