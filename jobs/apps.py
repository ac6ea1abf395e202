from importlib import import_module

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def import_models(self) -> None:
        """jobs/models.py, then the tables kept beside it (jobs/tables: that module is at
        its size limit), registered with this app at the same stage."""
        super().import_models()
        import_module("jobs.tables.uploads")
        import_module("jobs.tables.webhooks")
