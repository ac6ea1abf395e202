from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Installed for what Django finds only in an app: the portal's template tags
    (`templatetags/jobops_portal.py`, loaded by every app's templates) and the OTP
    device commands beside `otp_devices.py`, and the one table of the key-value store
    (`models.KvEntry`, core/kv.py). It has no admin."""

    name = "core"
    verbose_name = "jobops core"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from core.db import resolve_psycopg_dumpers
        from core.sqlfiles import install_after_migrate

        resolve_psycopg_dumpers()

        # Once per migrate: post_migrate is sent for every app, this receiver only for core.
        post_migrate.connect(install_after_migrate, sender=self, dispatch_uid="core.sqlfiles")
