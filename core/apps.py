from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Installed for what Django finds only in an app: the portal's template tags
    (`templatetags/jobops_portal.py`, loaded by every app's templates) and the OTP
    device commands beside `otp_devices.py`, and the one table of the key-value store
    (`models.KvEntry`, core/kv.py). It has no admin."""

    name = "core"
    verbose_name = "jobops core"
