# The job list's search by the end of a job id (the random part the portal shows).
# Built CONCURRENTLY: on a large jobs table a plain CREATE INDEX would block job creation
# and every transition for as long as it takes.

import django.db.models.functions.comparison
import django.db.models.functions.text
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('jobs', '0008_job_ids_time_ordered'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='job',
            index=models.Index(django.db.models.functions.comparison.Collate(django.db.models.functions.text.Reverse(django.db.models.functions.comparison.Cast('id', output_field=models.TextField())), 'C'), name='jobs_id_reversed_idx'),
        ),
    ]
