"""Checkpoints gain an Ed25519 signature next to their HMAC (audit.signing).

Existing checkpoints keep an empty one and stay verifiable by their HMAC online; adding a
column with a constant default rewrites no row, so the append-only triggers see nothing.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("audit", "0004_chain_functions")]

    operations = [
        migrations.AddField(
            model_name="auditcheckpoint",
            name="ed25519_signature",
            field=models.CharField(blank=True, default="", max_length=88),
        ),
    ]
