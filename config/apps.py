from typing import Any

from django.contrib.admin.apps import SimpleAdminConfig
from django.contrib.admin.checks import check_admin_app, check_dependencies
from django.core import checks

_discovered = False


def discover_admin_pages() -> None:
    """Import every app's admin pages and lock down the third-party ones, once.

    Only the processes that serve pages need them: the URLconf and the WSGI entry point
    call this, and the admin's system check calls it first. Workers, dispatchers and
    commands skip about a tenth of their start-up (the pages import the dashboard and
    every portal view).
    """
    global _discovered
    if _discovered:
        return
    from django.contrib import admin

    from config.admin_site import (
        limit_audit_logs_to_operator_orgs,
        lock_down_third_party_admins,
    )

    admin.autodiscover()
    lock_down_third_party_admins(admin.site)
    limit_audit_logs_to_operator_orgs(admin.site)
    _discovered = True


def check_admin_pages(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The admin's own check, over the pages: with them discovered first, whichever
    order the check registry runs its checks in."""
    discover_admin_pages()
    return check_admin_app(app_configs, **kwargs)


class JobopsAdminConfig(SimpleAdminConfig):
    # Every admin page sits behind password + OTP (django-otp's OTPAdminSite).
    default_site = "config.admin_site.JobopsAdminSite"

    def ready(self) -> None:
        # SimpleAdminConfig's ready() without its check_admin_app, which would check the
        # pages before anything discovered them.
        checks.register(check_dependencies, checks.Tags.admin)
        checks.register(check_admin_pages, checks.Tags.admin)
