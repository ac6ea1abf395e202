-- Every SQL statement of the core app, named and described (core/queries.py).


-- name: token_with_user
-- An API token by its key with its user (DRF's authtoken and Django's default user
-- tables), in one prepared statement: reading both through the ORM cost more than
-- running it. The token's columns come first, then the user's.
SELECT t.*, u.* FROM authtoken_token t JOIN auth_user u ON u.id = t.user_id
WHERE t.key = %(key)s;


-- name: statement_timeout_set
-- Sets this transaction's statement_timeout, returning the one it replaces (to set it
-- back).
SELECT current_setting('statement_timeout'), set_config('statement_timeout', %(timeout)s, true);


-- name: ping
-- The cheapest statement a connection can answer (the readiness probe).
SELECT 1;


-- name: kv_get
-- One live entry of the short-lived key-value store (core/kv.py, the jobops_kv table):
-- an expired row reads as missing until the sweep deletes it.
SELECT value FROM jobops_kv
WHERE key = %(key)s AND (expires_at IS NULL OR expires_at > clock_timestamp());


-- name: kv_set_many
-- Sets entries, each for `ttl_ms` milliseconds (NULL: until deleted), replacing what
-- the keys held. Keys are sorted so that two writers of the same keys lock them in
-- the same order.
INSERT INTO jobops_kv AS kv (key, value, expires_at)
SELECT i.key, i.value, clock_timestamp() + i.ttl_ms * interval '1 millisecond'
FROM unnest(%(keys)s::text[], %(values)s::text[], %(ttl_ms)s::bigint[]) AS i (key, value, ttl_ms)
ORDER BY i.key
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at;


-- name: kv_add
-- Sets the entry only where the key holds no live one (Django's cache.add); returns
-- the key when it was set.
INSERT INTO jobops_kv AS kv (key, value, expires_at)
VALUES (%(key)s, %(value)s, clock_timestamp() + %(ttl_ms)s::bigint * interval '1 millisecond')
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
WHERE kv.expires_at IS NOT NULL AND kv.expires_at <= clock_timestamp()
RETURNING key;


-- name: kv_touch
-- Gives a live entry a new lifetime (`ttl_ms`; NULL: until deleted); returns its key.
UPDATE jobops_kv
SET expires_at = clock_timestamp() + %(ttl_ms)s::bigint * interval '1 millisecond'
WHERE key = %(key)s AND (expires_at IS NULL OR expires_at > clock_timestamp())
RETURNING key;


-- name: kv_delete
-- Deletes entries by key; returns how many existed.
DELETE FROM jobops_kv WHERE key = ANY(%(keys)s::text[]);


-- name: kv_clear
-- Deletes every entry (Django's cache.clear(), as Redis' FLUSHDB).
DELETE FROM jobops_kv;


-- name: kv_scan
-- The live entries whose key starts with `prefix` (the liveness heartbeats); the key's
-- "C" collation keeps the comparison bytewise.
SELECT key, value FROM jobops_kv
WHERE starts_with(key, %(prefix)s) AND (expires_at IS NULL OR expires_at > clock_timestamp());


-- name: kv_buckets_lock
-- The token buckets of one rate-limit take (jobs/ratelimit.py), locked for the rest
-- of its transaction: a missing bucket is inserted empty (value NULL), an existing one
-- locked by the no-op update (of an unindexed column: a HOT update), so two takes of the same buckets run one after the
-- other and can never both spend the last token. Sorted keys: the same lock order in
-- every take. Returns each bucket's state (NULL when new or expired) and the
-- database's clock in milliseconds, the one clock every web host shares.
INSERT INTO jobops_kv AS kv (key, value, expires_at)
SELECT k, NULL, NULL FROM unnest(%(keys)s::text[]) AS k ORDER BY k
ON CONFLICT (key) DO UPDATE SET value = kv.value
RETURNING key,
    CASE WHEN kv.expires_at > clock_timestamp() THEN kv.value END,
    floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;


-- name: kv_sweep
-- Deletes up to `limit` expired entries (the dispatcher's kv_sweep step); returns how
-- many. Reads already ignore them: this only keeps the table small.
DELETE FROM jobops_kv
WHERE key IN (
    SELECT key FROM jobops_kv WHERE expires_at <= clock_timestamp() LIMIT %(limit)s
);
