-- Every SQL statement of the audit app, named and described (core/queries.py).
-- The chain rule itself (the hash, a job's chain name, the checkpoint barrier, the
-- insert into audit_logs, the canonical payload) is the SQL functions of audit/sql/:
-- these statements, and the jobs app's transitions, call them.


-- name: chain_lock
-- Serialises the appenders of one chain (not a job's: a job's row lock does that) until
-- commit, so that two appenders never read the same head and fork the chain.
SELECT pg_advisory_xact_lock(hashtextextended(%(chain)s, 0));


-- name: append
-- Appends one entry through audit_append_entries (the barrier, the hash, the insert),
-- its payload composed by audit_entry_payload from the same values (the one builder of
-- what is hashed, audit/sql/canonical.sql), returning the row as audit_logs holds it.
-- The payload's ts is the column's instant as verification writes it.
SELECT * FROM audit_append_entries(
    ARRAY[%(chain)s::text], ARRAY[%(job_id)s::uuid], ARRAY[%(seq)s::bigint],
    ARRAY[%(event_type)s::text], ARRAY[%(actor_type)s::text], ARRAY[%(actor_id)s::text],
    ARRAY[%(ts)s::timestamptz],
    ARRAY[audit_entry_payload(
        %(chain)s, %(seq)s,
        to_char(%(ts)s::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        %(event_type)s, %(actor_type)s, %(actor_id)s, %(job_id)s::uuid, %(data)s::jsonb
    )],
    ARRAY[%(prev_hash)s::text]
);


-- name: lock_timeout_set
-- Sets this transaction's lock_timeout, returning the one it replaces (to set it back).
SELECT current_setting('lock_timeout'), set_config('lock_timeout', %(timeout)s, true);


-- name: checkpoint_barrier
-- Takes the checkpoint barrier exclusively: waits for the appends in flight (each holds
-- it shared until commit) and holds new ones until this transaction ends.
SELECT pg_advisory_xact_lock(audit_barrier_key());


-- name: changed_heads
-- The head of each chain with an entry above the previous checkpoint's last_audit_id
-- (an id range of the primary key), with the highest id among them.
SELECT DISTINCT ON (chain) chain, seq, chain_hash, max(id) OVER ()
FROM audit_logs WHERE id > %(last_id)s ORDER BY chain, seq DESC;


-- name: all_heads_page
-- The heads of up to `limit` chains below `before` (NULL: from the last), in descending
-- chain order: a skip scan of the (chain, seq) index, one probe per chain, never a sort
-- of the whole log (audit.checkpoints.checkpoint_write_all_heads).
WITH RECURSIVE heads AS (
    (SELECT chain, seq, chain_hash, 1 AS n FROM audit_logs
     WHERE %(before)s::text IS NULL OR chain < %(before)s::text
     ORDER BY chain DESC, seq DESC LIMIT 1)
    UNION ALL
    SELECT x.chain, x.seq, x.chain_hash, h.n + 1 FROM heads h
    CROSS JOIN LATERAL (
        SELECT a.chain, a.seq, a.chain_hash FROM audit_logs a
        WHERE a.chain < h.chain ORDER BY a.chain DESC, a.seq DESC LIMIT 1
    ) AS x
    WHERE h.n < %(limit)s
)
SELECT chain, seq, chain_hash FROM heads;


-- name: chains_since
-- The chains with an entry at or after `since`, among `chains` (NULL: all).
SELECT DISTINCT chain FROM audit_logs
WHERE ts >= %(since)s AND (%(chains)s::text[] IS NULL OR chain = ANY(%(chains)s::text[]));


-- name: chains_present
-- Which of `chains` have any entry at all.
SELECT DISTINCT chain FROM audit_logs WHERE chain = ANY(%(chains)s::text[]);


-- name: chain_statistics
-- The planner's estimate of audit_logs rows and its histogram of chains (the most
-- common values when there is no histogram), sorted by the server: the ranges that
-- verification streams side by side are cut from it in the server's collation.
SELECT c.reltuples, (SELECT array_agg(v ORDER BY v) FROM unnest(coalesce(
    s.histogram_bounds::text::text[], s.most_common_vals::text::text[])) AS v)
FROM pg_class c LEFT JOIN pg_stats s ON s.schemaname = current_schema()
    AND s.tablename = c.relname AND s.attname = 'chain'
WHERE c.oid = 'audit_logs'::regclass;


-- name: export_snapshot
-- This transaction's snapshot, for the other streams of a verification to share.
SELECT pg_export_snapshot();


-- name: verify_rows
-- One row per entry of the chains in [low, high) among `chains` (each NULL: no bound),
-- in chain order. Besides the exact payload bytes it carries the canonical prefix
-- (actor, chain) and suffix (event_type, job_id, seq, ts) that the payload must have
-- around `data` (JCS sorts the keys), built from the columns by plain concatenation;
-- the server builds them while Python hashes the previous batch. Plain concatenation
-- does not JSON-escape: a string with a quote or backslash mismatches, and such a row
-- goes to the exact slow path (audit.verification._field_mismatch), which decides.
SELECT chain, seq, convert_to(payload, 'UTF8'), prev_hash, chain_hash,
       convert_to('{"actor":{"id":"' || actor_id || '","type":"' || actor_type
                  || '"},"chain":"' || chain || '","data":', 'UTF8'),
       convert_to(',"event_type":"' || event_type
                  || '","job_id":' || coalesce('"' || job_id::text || '"', 'null')
                  || ',"seq":' || seq::text
                  || ',"ts":"' || to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                  || '"}', 'UTF8')
FROM audit_logs
WHERE (%(chains)s::text[] IS NULL OR chain = ANY(%(chains)s::text[]))
  AND (%(low)s::text IS NULL OR chain >= %(low)s::text)
  AND (%(high)s::text IS NULL OR chain < %(high)s::text)
ORDER BY chain, seq;


-- name: row_detail
-- The columns of one entry, for saying what exactly is wrong with a suspect row.
SELECT job_id::text, event_type, actor_type, actor_id,
       to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), payload
FROM audit_logs WHERE chain = %(chain)s AND seq = %(seq)s;


-- name: verify_checkpoints
-- Every checkpoint in id order, its payload as raw bytes for the hash, and the heads of
-- a version 2 one (NULL on version 1), checked against the root its payload signs.
SELECT id, last_audit_id, prev_hash, checkpoint_hash, key_id, signature,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
       convert_to(payload, 'UTF8'), heads
FROM audit_checkpoints ORDER BY id;


-- name: verify_heads
-- The heads named by the `genuine` checkpoints, restricted to `chains` (NULL: all) and,
-- with `since`, every head of a checkpoint made since then (a chain deleted whole
-- leaves no row after `since`, its head in such a checkpoint still gives it away):
-- how many there are, then each whose entry is missing or has another hash (at most
-- `limit`). In SQL, an index probe on (chain, seq) per head, so that no checkpoint's
-- heads are held in Python memory.
WITH heads AS MATERIALIZED (
    SELECT c.id, h.chain, h.seq, coalesce(h.chain_hash, h.hash) AS hash, a.chain_hash
    FROM audit_checkpoints c
    CROSS JOIN LATERAL jsonb_to_recordset(coalesce(c.heads, c.payload::jsonb -> 'heads'))
        AS h(chain text, seq bigint, hash text, chain_hash text)
    LEFT JOIN audit_logs a ON a.chain = h.chain AND a.seq = h.seq
    WHERE c.id = ANY(%(genuine)s::bigint[])
      AND (%(chains)s::text[] IS NULL OR h.chain = ANY(%(chains)s::text[])
           OR c.created_at >= %(since)s::timestamptz)
)
SELECT total.n, bad.id, bad.chain, bad.seq, bad.hash, bad.chain_hash
FROM (SELECT count(*) AS n FROM heads) AS total
LEFT JOIN LATERAL (
    SELECT * FROM heads WHERE chain_hash IS DISTINCT FROM hash
    ORDER BY chain, seq, id LIMIT %(limit)s
) AS bad ON true;


-- name: checkpoints_present
-- Which of the exported checkpoint hashes `wanted` belong to a genuine checkpoint.
SELECT checkpoint_hash FROM audit_checkpoints
WHERE id = ANY(%(genuine)s::bigint[]) AND checkpoint_hash = ANY(%(wanted)s::text[]);


-- name: role_problems
-- Whether the current role is a superuser or may act as the owner of audit_logs
-- (either could disable the audit triggers), and its name.
SELECT r.rolsuper, pg_has_role(current_user, c.relowner, 'USAGE'), current_user
FROM pg_roles r LEFT JOIN pg_class c ON c.oid = to_regclass('audit_logs')
WHERE r.rolname = current_user;


-- name: writable_partitions
-- Each partition of audit_logs that the current role may change other than by INSERT
-- (UPDATE, DELETE, TRUNCATE, TRIGGER), with the privilege: none of them should be.
SELECT i.inhrelid::regclass::text, p.privilege
FROM pg_inherits i
CROSS JOIN unnest(ARRAY['UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER']) AS p(privilege)
WHERE i.inhparent = to_regclass('audit_logs')
  AND has_table_privilege(i.inhrelid, p.privilege)
ORDER BY 1, 2;


-- name: chain_head
-- The newest entry (seq, chain_hash) of a chain that is not a job's; no row for a chain
-- not yet started. Run after chain_lock: a statement that starts after the lock sees the
-- previous holder's commit (READ COMMITTED). First in the partition of the month of `ts` (the entry about to be
-- written: audit_part_for_other), then, only when that holds none of the chain, in
-- every partition before it (the newest earlier month's holds the head: seq grows with
-- the chain). A UNION ALL under LIMIT 1 runs its second branch only when the first
-- returned nothing.
(SELECT seq, chain_hash FROM audit_logs
 WHERE chain = %(chain)s AND part = audit_part_for_other(%(ts)s::timestamptz)
 ORDER BY seq DESC LIMIT 1)
UNION ALL
(SELECT seq, chain_hash FROM audit_logs
 WHERE chain = %(chain)s AND part < audit_part_for_other(%(ts)s::timestamptz)
 ORDER BY seq DESC LIMIT 1)
LIMIT 1;


-- name: read_only_snapshot
-- Makes the transaction just begun one REPEATABLE READ READ ONLY snapshot.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY;


-- name: begin_read_only
-- Begins a REPEATABLE READ READ ONLY transaction (a second verification stream).
BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;


-- name: set_snapshot
-- Puts the transaction on an exported snapshot; `{snapshot}` is composed as a literal
-- (psycopg.sql.Literal): SET takes no bound parameter.
SET TRANSACTION SNAPSHOT {snapshot};


-- name: archive_cutoff
-- The newest `limit` checkpoints created before `until` that carry an Ed25519 signature,
-- newest first: an archive ends at the first of them that verifies under the current key.
SELECT id, checkpoint_hash, ed25519_signature FROM audit_checkpoints
WHERE created_at < %(until)s AND ed25519_signature <> '' ORDER BY id DESC LIMIT %(limit)s;


-- name: archive_heads
-- The chains an archive holds, each with the head that a checkpoint up to `upto` names
-- and that checkpoint's id: every job chain whose last entry is `purged`, and the ops
-- chain up to the newest head named.
WITH named AS MATERIALIZED (
    SELECT c.id, h.chain, h.seq, coalesce(h.chain_hash, h.hash) AS hash
    FROM audit_checkpoints c
    CROSS JOIN LATERAL jsonb_to_recordset(coalesce(c.heads, c.payload::jsonb -> 'heads'))
        AS h(chain text, seq bigint, hash text, chain_hash text)
    WHERE c.id <= %(upto)s
)
SELECT chain, seq, hash, id FROM (
    SELECT DISTINCT ON (n.chain) n.chain, n.seq, n.hash, n.id
    FROM named n JOIN audit_logs a ON a.chain = n.chain AND a.seq = n.seq
    WHERE starts_with(n.chain, 'job:') AND a.event_type = 'purged'
      AND NOT EXISTS (SELECT 1 FROM audit_logs b WHERE b.chain = n.chain AND b.seq > n.seq)
    ORDER BY n.chain, n.id
) AS closed
UNION ALL
(SELECT chain, seq, hash, id FROM named WHERE chain = %(ops)s ORDER BY id DESC LIMIT 1);


-- name: archive_checkpoints
-- The checkpoints from `low` to `high` in id order, each with its payload: an archive
-- takes those it needs from them.
SELECT id, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
       prev_hash, checkpoint_hash, key_id, ed25519_signature, payload, heads
FROM audit_checkpoints WHERE id BETWEEN %(low)s AND %(high)s ORDER BY id;


-- name: archive_entries
-- The entries of `chains` from seq 1 up to each one's head in `heads`, in (chain, seq)
-- order; chains in byte order of the name (collation "C"), as Python sorts them.
SELECT a.chain, a.seq, a.payload, a.prev_hash, a.chain_hash
FROM unnest(%(chains)s::text[], %(heads)s::bigint[]) AS c(chain, head)
JOIN audit_logs a ON a.chain = c.chain AND a.seq <= c.head
ORDER BY a.chain COLLATE "C", a.seq;


-- name: proof_entries
-- One chain's entries in seq order, for a job's proof (audit.proofs), wherever they
-- are stored.
SELECT seq, payload, prev_hash, chain_hash FROM audit_logs
WHERE chain = %(chain)s ORDER BY seq;


-- name: proof_checkpoint
-- The first version 2 checkpoint that names `head` (a one-element JSON array of the
-- canonical head), through the GIN index on heads, with its leaf's tree size in the
-- checkpoint log.
SELECT c.id, c.payload, c.ed25519_signature, c.heads, t.tree_size
FROM audit_checkpoints c JOIN audit_tree_heads t ON t.checkpoint_id = c.id
WHERE c.heads IS NOT NULL AND c.heads @> %(head)s::jsonb
ORDER BY c.id LIMIT 1;


-- name: verify_tree_heads
-- Every signed tree head of the checkpoint log in order, with the hash of the checkpoint
-- it names as audit_checkpoints holds it (NULL: no such checkpoint).
SELECT t.tree_size, t.checkpoint_id, t.checkpoint_hash, c.checkpoint_hash, t.root_hash,
       to_char(t.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
       t.key_id, t.signature, t.nodes
FROM audit_tree_heads t LEFT JOIN audit_checkpoints c ON c.id = t.checkpoint_id
ORDER BY t.tree_size;


-- name: checkpoints_outside_log
-- Version 2 checkpoints (among `genuine`) that no tree head puts in the log.
SELECT c.id FROM audit_checkpoints c
WHERE c.id = ANY(%(genuine)s::bigint[]) AND c.heads IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM audit_tree_heads t WHERE t.checkpoint_id = c.id)
ORDER BY c.id LIMIT %(limit)s;
