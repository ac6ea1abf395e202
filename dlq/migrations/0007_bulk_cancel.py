# A background operation may also cancel jobs by filter (issue 29 point 7).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ('dlq', '0006_roles'),
        ('jobs', '0018_params_search_indexes'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='bulkoperation',
            name='bulk_ops_action_valid',
        ),
        migrations.AlterField(
            model_name='bulkoperation',
            name='action',
            field=models.CharField(choices=[('replay', 'Replay'), ('discard', 'Discard'), ('cancel', 'Cancel')], max_length=16),
        ),
        migrations.AddConstraint(
            model_name='bulkoperation',
            constraint=models.CheckConstraint(condition=models.Q(('action__in', ['replay', 'discard', 'cancel'])), name='bulk_ops_action_valid'),
        ),
    ]
