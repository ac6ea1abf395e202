# Indexes for the operator portal (issue 9): the dashboard's per-queue counts of unfinished
# jobs and its failures of the last 24 hours, and the job list's search by request id and
# idempotency key. Built CONCURRENTLY: on a large jobs table a plain CREATE INDEX would
# block job creation and every transition for as long as it takes.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('jobs', '0005_audit_head'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='deadletter',
            index=models.Index(fields=['created_at'], name='dl_created_idx'),
        ),
        AddIndexConcurrently(
            model_name='job',
            index=models.Index(condition=models.Q(('status__in', ['pending', 'queued', 'running', 'retrying'])), fields=['queue', 'status'], name='jobs_unfinished_idx'),
        ),
        AddIndexConcurrently(
            model_name='job',
            index=models.Index(condition=models.Q(('request_id__isnull', False)), fields=['request_id'], name='jobs_request_id_idx'),
        ),
        AddIndexConcurrently(
            model_name='job',
            index=models.Index(condition=models.Q(('idempotency_key__isnull', False)), fields=['idempotency_key'], name='jobs_idempotency_key_idx'),
        ),
    ]
