-- The statements of a partition's archive and detach (audit/partition_archive.py,
-- audit/detach.py, audit/history.py; docs/operations/audit-archives.md). A partition is
-- named by its `part` (audit.partitions): reads go through audit_logs with `part = %s`,
-- which the planner prunes to that one partition.


-- name: partition_open_chains
-- The job chains of the partition whose last entry is not `purged` (their job is still
-- there, or was deleted outside the purge): how many, and the first `limit` by name.
WITH last AS (
    SELECT DISTINCT ON (chain) chain, event_type FROM audit_logs
    WHERE part = %(part)s AND starts_with(chain, 'job:')
    ORDER BY chain, seq DESC
)
SELECT count(*) OVER (), chain FROM last WHERE event_type <> 'purged'
ORDER BY chain COLLATE "C" LIMIT %(limit)s;


-- name: partition_last_entries
-- Each chain of the partition, in byte order of the name: its first entry there (seq and
-- prev_hash: seq 1 and the genesis hash for a chain that starts in it), its last (seq,
-- chain_hash, event_type) and how many entries it has there.
WITH g AS (
    SELECT chain, min(seq) AS lo, max(seq) AS hi, count(*) AS n FROM audit_logs
    WHERE part = %(part)s GROUP BY chain
)
SELECT g.chain, g.lo, f.prev_hash, g.hi, l.chain_hash, l.event_type, g.n
FROM g
JOIN audit_logs f ON f.chain = g.chain AND f.seq = g.lo AND f.part = %(part)s
JOIN audit_logs l ON l.chain = g.chain AND l.seq = g.hi AND l.part = %(part)s
ORDER BY g.chain COLLATE "C";


-- name: partition_covering_checkpoints
-- For each chain of `chains` with its last seq in the partition `seqs` and that entry's
-- hash `hashes`: the first checkpoint (by id, up to `upto`) that names that very head
-- (job chains, which never grow after `purged`), or, for a chain that goes on in the
-- next partitions (`segment` true: the ops chain), the first head at or after it that a
-- checkpoint names, with that head. No row for a chain no checkpoint covers yet. Only
-- the checkpoints since `since` are read (the partition's month's start: none before it
-- can name its last entries), not every checkpoint's heads.
-- A version 2 checkpoint keeps its heads in `heads` (chain_hash), version 1 in its payload.
WITH wanted AS (
    SELECT * FROM unnest(%(chains)s::text[], %(seqs)s::bigint[], %(hashes)s::text[],
                         %(segment)s::boolean[]) AS w(chain, seq, hash, segment)
), named AS MATERIALIZED (
    SELECT c.id, h.chain, h.seq, coalesce(h.chain_hash, h.hash) AS hash
    FROM audit_checkpoints c
    CROSS JOIN LATERAL jsonb_to_recordset(coalesce(c.heads, c.payload::jsonb -> 'heads'))
        AS h(chain text, seq bigint, hash text, chain_hash text)
    WHERE c.id <= %(upto)s AND c.created_at >= %(since)s
      AND h.chain IN (SELECT chain FROM wanted)
)
SELECT DISTINCT ON (w.chain) w.chain, n.seq, n.hash, n.id
FROM wanted w JOIN named n ON n.chain = w.chain
    AND (n.seq = w.seq AND n.hash = w.hash OR w.segment AND n.seq > w.seq)
ORDER BY w.chain, n.seq, n.id;


-- name: partition_archive_entries
-- The entries of `chains` from seq `lows` up to each one's head in `heads`, in (chain,
-- seq) order, chains in byte order of the name (collation "C"), as Python sorts them;
-- a segment chain's entries may go on past the partition, up to the head a checkpoint
-- names.
SELECT a.chain, a.seq, a.payload, a.prev_hash, a.chain_hash
FROM unnest(%(chains)s::text[], %(lows)s::bigint[], %(heads)s::bigint[]) AS c(chain, low, head)
JOIN audit_logs a ON a.chain = c.chain AND a.seq BETWEEN c.low AND c.head
ORDER BY a.chain COLLATE "C", a.seq;


-- name: partition_owner
-- Whether the current role may act as the owner of the partition (owns it, or is a
-- member of its owner; a superuser may too), and the names of both.
SELECT pg_has_role(current_user, c.relowner, 'USAGE'), current_user, c.relowner::regrole::text
FROM pg_class c WHERE c.oid = to_regclass(%(name)s);


-- name: partition_attached
-- Whether the table `name` is a partition of audit_logs.
SELECT EXISTS (
    SELECT FROM pg_inherits
    WHERE inhparent = 'audit_logs'::regclass AND inhrelid = to_regclass(%(name)s)
);


-- name: partition_rows
-- The partition's exact row count (audit_detach compares it with its archive's).
SELECT count(*) FROM audit_logs WHERE part = %(part)s;


-- name: detached_entries
-- The payloads of the ops chain's `audit_partition_detached` entries, oldest first: every
-- partition that left the database, its archive's sha256 and the checkpoint.
SELECT seq, payload FROM audit_logs
WHERE chain = %(ops)s AND event_type = 'audit_partition_detached' ORDER BY seq;


-- name: checkpoint_by_hash
-- A checkpoint's id and payload by its hash.
SELECT id, payload FROM audit_checkpoints WHERE checkpoint_hash = %(hash)s;


-- name: checkpoints_by_id
-- The checkpoints `ids` (id, hash, payload): an archive's checkpoints against the live
-- ones, which are never removed.
SELECT id, checkpoint_hash, payload FROM audit_checkpoints WHERE id = ANY(%(ids)s::bigint[]);


-- name: verify_heads_detached
-- verify_heads (audit/queries.sql) once partitions were detached: a head a genuine
-- checkpoint names may be gone with its partition. It is not reported when its entry is
-- before where its chain starts in the live database (`starts`: the ops chain after its
-- detached segments), or, with archives (`archived` true), when a verified archive holds
-- its chain up to at least that seq (`a_chains`, `a_heads`: each chain once), or,
-- without them, when its whole chain is gone and the checkpoint is no newer than the
-- newest one a detached partition's archive carries (`archived_upto`): those are counted
-- apart (`deferred`).
WITH starts AS (
    SELECT * FROM unnest(%(s_chains)s::text[], %(s_seqs)s::bigint[]) AS s(chain, seq)
), archived AS MATERIALIZED (
    SELECT * FROM unnest(%(a_chains)s::text[], %(a_heads)s::bigint[]) AS r(chain, head)
), heads AS MATERIALIZED (
    SELECT c.id, h.chain, h.seq, coalesce(h.chain_hash, h.hash) AS hash, a.chain_hash,
           a.chain_hash IS NULL AND (
               EXISTS (SELECT FROM starts s WHERE s.chain = h.chain AND h.seq < s.seq)
               OR (%(archived)s AND coalesce(h.seq <= r.head, false))
               OR (NOT %(archived)s AND c.id <= %(archived_upto)s
                   AND NOT EXISTS (SELECT FROM audit_logs x WHERE x.chain = h.chain))
           ) AS deferred
    FROM audit_checkpoints c
    CROSS JOIN LATERAL jsonb_to_recordset(coalesce(c.heads, c.payload::jsonb -> 'heads'))
        AS h(chain text, seq bigint, hash text, chain_hash text)
    LEFT JOIN audit_logs a ON a.chain = h.chain AND a.seq = h.seq
    -- A join (hashed), not EXISTS per head: a year's archives name hundreds of thousands
    -- of chains, and the CTE has no index (EXISTS took minutes for 140,000 of them).
    LEFT JOIN archived r ON r.chain = h.chain
    WHERE c.id = ANY(%(genuine)s::bigint[])
      AND (%(chains)s::text[] IS NULL OR h.chain = ANY(%(chains)s::text[])
           OR c.created_at >= %(since)s::timestamptz)
)
SELECT total.n, total.d, bad.id, bad.chain, bad.seq, bad.hash, bad.chain_hash
FROM (SELECT count(*) FILTER (WHERE NOT deferred) AS n,
             count(*) FILTER (WHERE deferred) AS d FROM heads) AS total
LEFT JOIN LATERAL (
    SELECT * FROM heads WHERE chain_hash IS DISTINCT FROM hash AND NOT deferred
    ORDER BY chain, seq, id LIMIT %(limit)s
) AS bad ON true;


-- name: partition_jobs_left
-- Whether a job created in [low, high) with the part `part` is still in the database (its
-- chain is then open: a chain closes with the purge that removes its row). Served by
-- jobs_created_idx: the dispatcher's cheap look before partition_open_chains' scan.
SELECT EXISTS (
    SELECT FROM jobs WHERE created_at >= %(low)s AND created_at < %(high)s AND audit_part = %(part)s
);
