-- The chain rule of docs/architecture.md#the-audit-chain as SQL functions: the current
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
