# The annotations of a job (docs/architecture.md#annotations) live in the annotating
# jobs' own chains, as `annotated` entries naming the job in their payload; a job's
# page reads them by that name (jobs.selectors.annotations.job_annotations). Without
# this index that read is a scan of every audit row (the payload is text, parsed per
# row): the audit log is the largest table and grows forever. Partial: only
# `annotated` entries, a sliver of the log, are parsed and indexed; every other append
# pays nothing. The expression must stay the selector's ANNOTATED_TARGET.
# Built CONCURRENTLY: a plain CREATE INDEX would block every audit append (every job
# transition) for as long as it takes on a large log.

from django.db import migrations

INDEX = "audit_annotated_target_idx"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("audit", "0008_canonical_builder")]

    operations = [
        migrations.RunSQL(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON audit_logs "
            "(((payload::jsonb -> 'data') ->> 'target_job_id')) "
            "WHERE event_type = 'annotated'",
            f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}",
        ),
    ]
