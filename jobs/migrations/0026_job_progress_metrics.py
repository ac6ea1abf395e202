# A progress value's metrics (ctx.progress(..., metrics=...)): one nullable jsonb column
# without a default, so adding it rewrites nothing. The function that writes them,
# jobs_progress_with_metrics, is installed after migrate with the others
# (jobs/sql/20_transitions.sql); jobs_progress stays one release for the processes of
# the previous one (docs/operations/upgrading.md#sql-functions).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0025_pending_idx_gauge_only"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="progress_metrics",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
