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
