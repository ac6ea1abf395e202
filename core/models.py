from django.db import models


class KvEntry(models.Model):
    """One entry of the short-lived key-value store of core/kv.py (PostgreSQL backend).

    UNLOGGED (core/migrations/0001): everything here may be lost, so no WAL is written
    for it. Read and written only through the named statements of core/queries.sql;
    the model exists for the migration and for the test suite's flush.
    """

    # "C" collation: keys compare bytewise, the prefix scan (kv_scan) with them.
    key = models.TextField(primary_key=True, db_collation="C")
    value = models.TextField(null=True)
    # NULL: until deleted. Expired rows read as missing until the sweep deletes them.
    expires_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "jobops_kv"
