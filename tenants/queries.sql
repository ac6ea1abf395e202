-- Every SQL statement of the tenants app, named and described (tenants/queries.py).


-- name: api_token_with_user
-- An API token by the sha256 of its key (the unique index on digest) with its user, in
-- one prepared statement, as core's token_with_user does for the legacy tokens. The
-- token's columns come first, then the user's.
SELECT t.*, u.* FROM api_tokens t JOIN auth_user u ON u.id = t.user_id
WHERE t.digest = %(digest)s;
