-- The one builder of what an audit entry hashes (docs/architecture.md#canonical-json-and-hashing):
-- RFC 8785 (JCS) text of a jsonb value, byte-equal to the `rfc8785` package that
-- verification (audit/canonical.py) recomputes it with. `jsonb::text` is not JCS: jsonb
-- orders keys by length first and writes ", " and ": ". What this builder writes:
-- - object keys sorted by their UTF-16 code units (audit_jcs_key_order), no spaces;
-- - strings escaped as jsonb writes them, which is JCS's rule: \" \\ \b \f \n \r \t,
--   \u00xx (lowercase) for the other control characters, everything else (DEL,
--   non-ASCII, astral characters) as it is. U+0000 never gets here: jsonb refuses it;
-- - integers as digits, refused beyond +-(2**53 - 1) (as rfc8785 refuses a Python int;
--   jsonb cannot tell 1e16 the float from the integer, so both are refused: keep
--   floats out of hashed payloads); other numbers as ECMAScript writes the double
--   (audit_jcs_float).


-- Raises: JCS cannot represent `v`. IMMUTABLE (it always raises for the same value)
-- so that the SQL functions calling it stay inlinable; the planner folds it only where
-- `v` is a constant that reaches it, which would raise when run anyway.
CREATE OR REPLACE FUNCTION audit_jcs_refuse(v text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'jobops: % is not representable in RFC 8785 JSON', v
        USING ERRCODE = 'numeric_value_out_of_range';
END;
$$;


-- A double as ECMAScript's Number::toString writes it (ECMA-262 7.1.12.1, RFC 8785
-- 3.2.2.3), from the shortest digits that PostgreSQL's float8 output gives (since 12):
-- `d` the significant digits, `n` where the decimal point goes (value = 0.d * 10^n).
CREATE OR REPLACE FUNCTION audit_jcs_float(f float8) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN f = 0 THEN '0'
        WHEN f < 0 THEN '-' || audit_jcs_float(-f)
        WHEN n BETWEEN length(d) AND 21 THEN d || repeat('0', n - length(d))
        WHEN n BETWEEN 1 AND 21 THEN left(d, n) || '.' || substr(d, n + 1)
        WHEN n BETWEEN -5 AND 0 THEN '0.' || repeat('0', -n) || d
        ELSE left(d, 1) || CASE WHEN length(d) > 1 THEN '.' || substr(d, 2) ELSE '' END
             || 'e' || CASE WHEN n - 1 >= 0 THEN '+' ELSE '-' END || abs(n - 1)::text
    END
    FROM (
        SELECT rtrim(ltrim(replace(m[1], '.', ''), '0'), '0') AS d,
               coalesce(length(split_part(m[1], '.', 1)), 0)
               + coalesce(m[2]::int, 0)
               - (length(replace(m[1], '.', '')) - length(ltrim(replace(m[1], '.', ''), '0'))) AS n
        FROM regexp_match(f::text, '^([0-9.]+)(?:e([-+][0-9]+))?$') AS m
    ) AS s
$$;


-- A JSON number: integers (scale 0) as digits within JCS's safe range, others as
-- doubles. Not STRICT, and one expression, so that the planner inlines it.
CREATE OR REPLACE FUNCTION audit_jcs_number(v numeric) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN v IS NULL THEN NULL
        WHEN scale(v) > 0 THEN audit_jcs_float(v::float8)
        WHEN abs(v) <= 9007199254740991 THEN v::text
        ELSE audit_jcs_refuse(v::text)
    END
$$;


-- audit_jcs_key_order of a key with a character in U+E000..U+FFFF.
CREATE OR REPLACE FUNCTION audit_jcs_key_order_moved(k text) RETURNS bytea
LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT string_agg(CASE WHEN ascii(c) BETWEEN 57344 AND 65535
                           THEN set_byte(convert_to(c, 'UTF8'), 0,
                                         get_byte(convert_to(c, 'UTF8'), 0) + 10)
                           ELSE convert_to(c, 'UTF8') END,
                      ''::bytea ORDER BY i)
    FROM regexp_split_to_table(k, '') WITH ORDINALITY AS t(c, i)
$$;


-- The sort key of an object key: UTF-16 code unit order (RFC 8785 3.2.3). UTF-8 bytes
-- sort by code point, which is UTF-16 order except that U+E000..U+FFFF sort after the
-- astral planes in UTF-16 (whose surrogates are D800..DFFF). Those characters' lead
-- bytes (EE, EF, which occur nowhere else in UTF-8) are moved past the astral lead bytes
-- (F0..F4) to F8, F9; keys without them are their UTF-8 bytes. One expression, and
-- STABLE as convert_to is, so that the planner inlines it (an IMMUTABLE declaration
-- over a STABLE body is not inlined: a function call per key, several times slower).
CREATE OR REPLACE FUNCTION audit_jcs_key_order(k text) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN k !~ '[\uE000-\uFFFF]' THEN convert_to(k, 'UTF8')
                ELSE audit_jcs_key_order_moved(k) END
$$;


-- RFC 8785 text of `v`: one query per non-empty object or array (its members sorted
-- and joined, each through audit_jcs_member), the rest without a query. Keys sort by
-- code point (collation "C", UTF-8 byte order) unless the object's text holds a
-- character of U+E000..U+FFFF, the only case where UTF-16 order differs (see
-- audit_jcs_key_order): the common case without a sort key per key.
CREATE OR REPLACE FUNCTION audit_canonical(v jsonb) RETURNS text
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE AS $$
DECLARE
    out text;
BEGIN
    CASE jsonb_typeof(v)
    WHEN 'object' THEN
        IF v = '{}' THEN
            RETURN '{}';
        ELSIF v::text !~ '[\uE000-\uFFFF]' THEN
            SELECT '{' || string_agg(to_json(e.key)::text || ':' || audit_jcs_member(e.value),
                                     ',' ORDER BY e.key COLLATE "C") || '}'
            INTO out FROM jsonb_each(v) AS e;
        ELSE
            SELECT '{' || string_agg(to_json(e.key)::text || ':' || audit_jcs_member(e.value),
                                     ',' ORDER BY audit_jcs_key_order(e.key)) || '}'
            INTO out FROM jsonb_each(v) AS e;
        END IF;
    WHEN 'array' THEN
        IF v = '[]' THEN
            RETURN '[]';
        END IF;
        SELECT '[' || string_agg(audit_jcs_member(e.value), ',' ORDER BY e.i) || ']'
        INTO out FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, i);
    WHEN 'number' THEN
        RETURN audit_jcs_number(v::numeric);
    ELSE
        RETURN v::text;  -- a string (JCS's escapes, see above), true, false or null
    END CASE;
    RETURN out;
END;
$$;


-- One member of an object or array, inlined into audit_canonical's queries (one
-- expression): a nested object or array by a call, strings, true, false and null as
-- jsonb writes them, numbers by audit_jcs_number.
CREATE OR REPLACE FUNCTION audit_jcs_member(v jsonb) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE jsonb_typeof(v)
        WHEN 'string' THEN v::text
        -- up to 15 characters without a point: an integer within 2**53 - 1 (jsonb
        -- writes numbers without an exponent), as it is
        WHEN 'number' THEN CASE WHEN length(v::text) <= 15 AND strpos(v::text, '.') = 0
                                THEN v::text ELSE audit_jcs_number(v::numeric) END
        WHEN 'object' THEN audit_canonical(v)
        WHEN 'array' THEN audit_canonical(v)
        ELSE v::text
    END
$$;


-- audit_entry_payload (below) with `p_data_jcs` the data's RFC 8785 text already: for a caller
-- that composes data of a shape it knows by concatenation, which costs a few
-- microseconds where audit_canonical's queries cost tens (jobs_entry_payload).
CREATE OR REPLACE FUNCTION audit_entry_payload_jcs(
    p_chain text, p_seq bigint, p_ts text, p_event_type text, p_actor_type text,
    p_actor_id text, p_job_id uuid, p_data_jcs text
) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '{"actor":{"id":' || to_jsonb(p_actor_id)::text
        || ',"type":' || to_jsonb(p_actor_type)::text
        || '},"chain":' || to_jsonb(p_chain)::text
        || ',"data":' || p_data_jcs
        || ',"event_type":' || to_jsonb(p_event_type)::text
        || ',"job_id":' || coalesce('"' || p_job_id::text || '"', 'null')
        || ',"seq":' || audit_jcs_number(p_seq)
        || ',"ts":' || to_jsonb(p_ts)::text || '}'
$$;


-- The canonical text of an entry's payload (audit.canonical.entry_payload): its columns
-- and `p_data`, keys in JCS order (actor{id,type}, chain, data, event_type, job_id, seq,
-- ts). `p_ts` is the entry's time as the payload writes it (audit.services.format_ts).
CREATE OR REPLACE FUNCTION audit_entry_payload(
    p_chain text, p_seq bigint, p_ts text, p_event_type text, p_actor_type text,
    p_actor_id text, p_job_id uuid, p_data jsonb
) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT audit_entry_payload_jcs(
        p_chain, p_seq, p_ts, p_event_type, p_actor_type, p_actor_id, p_job_id,
        coalesce(audit_canonical(p_data), '{}')
    )
$$;
