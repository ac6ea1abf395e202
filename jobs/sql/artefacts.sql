-- The artefacts of a job as its body lists them, one JSON array in the body's order
-- (kind, name), each element the artefact's stored fields that jobs.representation's
-- ARTEFACT_BODY reads (jobs.selectors.job_from_rows makes them Artefact instances).
-- job_read and job_repeat_by_key (jobs/queries.sql) both answer with it, so its
-- fields are spelled here once. PL/pgSQL so that its plan is kept per session: the
-- API's most frequent read calls it.
CREATE OR REPLACE FUNCTION jobs_artefacts_json(p_job_id uuid) RETURNS json
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT coalesce(json_agg(json_build_object(
            'id', a.id, 'kind', a.kind, 'name', a.name, 'content_type', a.content_type,
            'file', a.file, 'sha256', a.sha256, 'size', a.size) ORDER BY a.kind, a.name), '[]')
        FROM artefacts a WHERE a.job_id = p_job_id
    );
END
$$;
