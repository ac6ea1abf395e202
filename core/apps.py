from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Installed for what Django finds only in an app: the portal's template tags
    (`templatetags/jobops_portal.py`, loaded by every app's templates) and the OTP
    device commands beside `otp_devices.py`. It has no models and no admin."""

    name = "core"
    verbose_name = "jobops core"
