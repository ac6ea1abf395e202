-- Every SQL statement of the tenants app, named and described (tenants/queries.py).


-- name: api_token_with_user
-- An API token by the sha256 of its key (the unique index on digest) with its user, in
-- one prepared statement, as core's token_with_user does for the legacy tokens. The
-- token's columns come first, then the user's.
SELECT t.*, u.* FROM api_tokens t JOIN auth_user u ON u.id = t.user_id
WHERE t.digest = %(digest)s;


-- name: caller_memberships
-- A caller's organisations (memberships_of) and whether it is a service account
-- (is_service_account), in one prepared statement: every API create asks both, and
-- the two ORM reads cost more Python than the job's own insert. One row with NULL
-- membership columns when the user belongs to no organisation.
SELECT s.service, m.organisation_id, o.slug, m.role, o.shared_visibility,
       o.suspended_at IS NOT NULL AS suspended
FROM (SELECT EXISTS (SELECT FROM service_accounts WHERE user_id = %(user_id)s) AS service) AS s
LEFT JOIN (memberships m JOIN organisations o ON o.id = m.organisation_id)
    ON m.user_id = %(user_id)s
ORDER BY m.id;
