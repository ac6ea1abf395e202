from django.contrib.admin.apps import AdminConfig


class JobopsAdminConfig(AdminConfig):
    # Every admin page sits behind password + OTP (django-otp's OTPAdminSite).
    default_site = "config.admin_site.JobopsAdminSite"

    def ready(self) -> None:
        super().ready()  # every app's admin.py registers its models
        from django.contrib import admin

        from config.admin_site import (
            limit_audit_logs_to_operator_orgs,
            lock_down_third_party_admins,
        )

        lock_down_third_party_admins(admin.site)
        limit_audit_logs_to_operator_orgs(admin.site)
