-- The statements of incremental verification (audit/incremental.py), read as
-- audit/queries.sql is (core/queries.py). Every one selects by id or by checkpoint,
-- never by partition: where a row is stored does not matter.


-- name: checkpoint_by_hash
-- The checkpoints with this hash (one, unless someone forged a copy), as
-- verify_checkpoints returns them, then the Ed25519 signature, created_at and the heads
-- of a version 2 checkpoint (NULL on version 1, whose payload holds them).
SELECT id, last_audit_id, prev_hash, checkpoint_hash, key_id, signature,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
       convert_to(payload, 'UTF8'), ed25519_signature, created_at, heads
FROM audit_checkpoints WHERE checkpoint_hash = %(hash)s ORDER BY id LIMIT 2;


-- name: checkpoint_by_id
-- One checkpoint by id, as checkpoint_by_hash.
SELECT id, last_audit_id, prev_hash, checkpoint_hash, key_id, signature,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
       convert_to(payload, 'UTF8'), ed25519_signature, created_at, heads
FROM audit_checkpoints WHERE id = %(id)s;


-- name: checkpoint_before
-- The hash of the checkpoint before `id` (none: it is the first).
SELECT checkpoint_hash FROM audit_checkpoints WHERE id < %(id)s ORDER BY id DESC LIMIT 1;


-- name: checkpoints_after
-- Every checkpoint after `id`, in id order, as checkpoint_by_hash.
SELECT id, last_audit_id, prev_hash, checkpoint_hash, key_id, signature,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
       convert_to(payload, 'UTF8'), ed25519_signature, created_at, heads
FROM audit_checkpoints WHERE id > %(id)s ORDER BY id;


-- name: new_rows_range
-- The highest id above `last_id` (one probe of the primary key's index).
SELECT max(id) FROM audit_logs WHERE id > %(last_id)s;


-- name: new_rows
-- The entries with `low` < id <= `high`, in id order (a range scan of the primary key,
-- no sort), with the canonical prefix and suffix of verify_rows (audit/queries.sql).
SELECT id, chain, seq, convert_to(payload, 'UTF8'), prev_hash, chain_hash,
       convert_to('{"actor":{"id":"' || actor_id || '","type":"' || actor_type
                  || '"},"chain":"' || chain || '","data":', 'UTF8'),
       convert_to(',"event_type":"' || event_type
                  || '","job_id":' || coalesce('"' || job_id::text || '"', 'null')
                  || ',"seq":' || seq::text
                  || ',"ts":"' || to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                  || '"}', 'UTF8')
FROM audit_logs WHERE id > %(low)s AND id <= %(high)s ORDER BY id;


-- name: previous_entries
-- The entries (chain, seq) of the given pairs, with their id, to which the first new
-- entry of each chain links when no verified checkpoint names them.
SELECT p.chain, p.seq, a.id, a.prev_hash, a.chain_hash, convert_to(a.payload, 'UTF8')
FROM unnest(%(chains)s::text[], %(seqs)s::bigint[]) AS p(chain, seq)
LEFT JOIN audit_logs a ON a.chain = p.chain AND a.seq = p.seq;
