"""Each job stores its type's category (docs/configuration.md#job-categories), and its
idempotency key when it was last repeated (docs/api.md#idempotency).

The jobs that exist get their type's category from the types table as it is when this
runs, one UPDATE per category. A job whose type is no longer in the table gets
`maintenance`: no category of the table describes it, and it is kept (retention) the
shortest.
"""

from django.conf import settings
from django.db import migrations, models


def fill_categories(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    types: dict[str, list[str]] = {}
    for name, spec in settings.JOB_TYPES.items():
        types.setdefault(spec["category"], []).append(name)
    for category, names in types.items():
        Job.objects.filter(category__isnull=True, type__in=names).update(category=category)
    Job.objects.filter(category__isnull=True).update(category="maintenance")


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0011_purge"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="category",
            field=models.CharField(max_length=32, null=True),
        ),
        migrations.RunPython(fill_categories, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="job",
            name="category",
            field=models.CharField(max_length=32),
        ),
        migrations.AddField(
            model_name="job",
            name="idempotency_last_seen_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
