-- The connector breakers' count of what runs came to (docs/connectors.md), for the
-- completer (jobs.services.completion), which writes every run's end under both
-- executors. Installed after migrations by core/sqlfiles.py; idempotent.

-- breakers_count: the ends of a batch of runs (`p_connectors`, `p_job_ids`, `p_outcomes`:
-- 'succeeded' or 'failed', a connector failure with its error code `p_codes`), counted
-- by their connectors' breakers in the batch's order, each as it would be counted
-- alone: a failure is one more in a row (its code the last), and opens a closed breaker
-- whose failures reach its connector's threshold (`p_names`, `p_thresholds`) or the
-- half-open breaker whose probe it is, for `p_cooldowns` seconds (opened_at, probe_at,
-- the probe and any operator's note forgotten); a success resets a closed breaker's
-- count and closes the half-open breaker whose probe it is. Failures while open, or
-- during another job's probe, change no state; a success while open changes nothing.
-- Each breaker row the batch changes is locked (in name order) and written once, in one
-- UPDATE, however many of its ends the batch holds; a row the batch leaves as it is (a
-- closed breaker with no failures that hears only successes) is not even locked. A
-- connector's first failure makes its row. Returns, for each end of a changed breaker,
-- its place in the batch (`end_n`, from 1), the state it found and left, the failures and
-- probe time after it, and the database's now (the caller audits each change of state
-- on the ops chain, in the same transaction).
CREATE OR REPLACE FUNCTION breakers_count(
    p_names text[], p_thresholds int[], p_cooldowns float8[], p_connectors text[],
    p_job_ids uuid[], p_outcomes text[], p_codes text[]
) RETURNS TABLE (
    end_n int, state_left text, state_after text, failures_after int,
    probe_at_after timestamptz, db_now timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    e record;
    b connector_breakers;
    opening boolean;
BEGIN
    INSERT INTO connector_breakers (name, state, failures, changed_at, reason)
    SELECT DISTINCT f.connector, 'closed', 0, now(), ''
    FROM unnest(p_connectors, p_outcomes) AS f(connector, outcome)
    WHERE f.outcome = 'failed'
    ORDER BY 1
    ON CONFLICT (name) DO NOTHING;
    FOR c IN
        SELECT k.name, k.threshold, k.cooldown
        FROM unnest(p_names, p_thresholds, p_cooldowns) AS k(name, threshold, cooldown)
        ORDER BY k.name
    LOOP
        SELECT * INTO b FROM connector_breakers r
        WHERE r.name = c.name
          AND ((r.state = 'closed' AND r.failures > 0)
               OR EXISTS (
                   SELECT FROM unnest(p_connectors, p_job_ids, p_outcomes)
                       AS x(connector, job_id, outcome)
                   WHERE x.connector = c.name
                     AND (x.outcome = 'failed'
                          OR (r.state = 'half_open' AND r.probe_job_id = x.job_id))))
        FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        FOR e IN
            SELECT x.n, x.job_id, x.outcome, x.code
            FROM unnest(p_connectors, p_job_ids, p_outcomes, p_codes)
                WITH ORDINALITY AS x(connector, job_id, outcome, code, n)
            WHERE x.connector = c.name
            ORDER BY x.n
        LOOP
            state_left := b.state;
            IF e.outcome = 'failed' THEN
                opening := (b.state = 'closed' AND b.failures + 1 >= c.threshold)
                    OR (b.state = 'half_open' AND b.probe_job_id = e.job_id);
                b.failures := b.failures + 1;
                b.last_error_code := e.code;
                IF opening THEN
                    b.state := 'open';
                    b.opened_at := now();
                    b.probe_at := now() + make_interval(secs => c.cooldown);
                    b.probe_job_id := NULL;
                    b.probe_started_at := NULL;
                    b.changed_at := now();
                    b.changed_by_id := NULL;
                    b.reason := '';
                END IF;
            ELSIF (b.state = 'closed' AND b.failures > 0)
                  OR (b.state = 'half_open' AND b.probe_job_id = e.job_id) THEN
                IF b.state <> 'closed' THEN
                    b.changed_at := now();
                    b.changed_by_id := NULL;
                    b.reason := '';
                END IF;
                b.state := 'closed';
                b.failures := 0;
                b.opened_at := NULL;
                b.probe_at := NULL;
                b.probe_job_id := NULL;
                b.probe_started_at := NULL;
            END IF;
            end_n := e.n;
            state_after := b.state;
            failures_after := b.failures;
            probe_at_after := b.probe_at;
            db_now := now();
            RETURN NEXT;
        END LOOP;
        UPDATE connector_breakers r SET
            state = b.state, failures = b.failures, last_error_code = b.last_error_code,
            opened_at = b.opened_at, probe_at = b.probe_at, probe_job_id = b.probe_job_id,
            probe_started_at = b.probe_started_at, changed_at = b.changed_at,
            changed_by_id = b.changed_by_id, reason = b.reason
        WHERE r.name = c.name;
    END LOOP;
END;
$$;
