# Indexes for the portal's search and cancel by filter (issue 29 point 7): params by value
# (jsonb containment, GIN with jsonb_path_ops) and the last error code. Built
# CONCURRENTLY: on a large jobs table a plain CREATE INDEX would block job creation and
# every transition for as long as it takes.

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('jobs', '0017_rerun_params_edits'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='job',
            index=django.contrib.postgres.indexes.GinIndex(fields=['params'], name='jobs_params_gin', opclasses=['jsonb_path_ops']),
        ),
        AddIndexConcurrently(
            model_name='job',
            index=models.Index(condition=models.Q(('last_error_code__isnull', False)), fields=['last_error_code'], name='jobs_last_error_code_idx'),
        ),
    ]
