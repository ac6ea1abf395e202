-- Functions the previous release's processes still call, kept one release while a
-- deployment runs both (docs/operations/upgrading.md). Each is today's function under
-- its former signature; none is a kind of change of its own (jobs.services.transitions).

-- The progress write before metrics: the same write with none.
CREATE OR REPLACE FUNCTION jobs_progress(
    p_ids uuid[], p_attempts int[], p_locked_by text, p_percents int[], p_steps text[],
    p_messages text[], p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE sql AS $$
    SELECT * FROM jobs_progress_with_metrics(
        p_ids, p_attempts, p_locked_by, p_percents, p_steps, p_messages,
        array_fill(NULL::jsonb, ARRAY[cardinality(p_ids)]), p_data, p_actor_type,
        p_actor_id, p_ts, p_request_id
    );
$$;
