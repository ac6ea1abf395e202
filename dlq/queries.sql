-- The dlq app's SQL, each statement named and written once (core/queries.py loads
-- this file into dlq.sql.QUERIES when the module is imported).

-- name: claim_bulk_operation
-- Leases the oldest background replay or discard that no dispatcher holds (queued,
-- or running with an expired lease), marks it running and returns its id. SKIP
-- LOCKED: concurrent dispatchers take different operations, or none.
-- Parameters: the lease owner (host:pid) and the lease length in seconds.
UPDATE dlq_bulk_operations
   SET lease_owner = %s, lease_until = now() + make_interval(secs => %s),
       state = 'running', started_at = coalesce(started_at, now()), updated_at = now()
 WHERE id = (
       SELECT id FROM dlq_bulk_operations
        WHERE state IN ('queued', 'running')
          AND (lease_until IS NULL OR lease_until < now())
        ORDER BY created_at
        LIMIT 1
          FOR UPDATE SKIP LOCKED)
RETURNING id;
