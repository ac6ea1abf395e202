"""Organisations, their projects, members, service accounts and API tokens
(docs/tenancy.md).

Every job belongs to one organisation (and optionally one of its projects); a caller
sees and acts only within the organisations it belongs to. A service account is an
organisation's own API identity: a Django user that no person logs in as, whose jobs
are audited with `actor_type=service`.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

# The organisation every job made before tenancy moved into (tenants/migrations/0001),
# and the one `make run` puts its first admin in.
DEFAULT_ORG_SLUG = "default"


class Organisation(models.Model):
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=200)
    # Members see every job of the organisation, not only their own.
    shared_visibility = models.BooleanField(default=False)
    # Set while suspended: new jobs are refused (403), waiting ones held.
    suspended_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "organisations"
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def suspended(self) -> bool:
        return self.suspended_at is not None


class Project(models.Model):
    organisation = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, related_name="projects"
    )
    slug = models.SlugField(max_length=50)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "projects"
        ordering = ["organisation__slug", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["organisation", "slug"], name="projects_org_slug_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.organisation.slug}/{self.slug}"


class Role(models.TextChoices):
    MEMBER = "member"
    ADMIN = "admin"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    organisation = models.ForeignKey(
        Organisation, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "memberships"
        constraints = [
            models.UniqueConstraint(fields=["user", "organisation"], name="memberships_uniq"),
            models.CheckConstraint(
                condition=Q(role__in=Role.values), name="memberships_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organisation} ({self.role})"


class ServiceAccount(models.Model):
    """An organisation's API identity; `user` is the account jobs are owned by (it has
    no usable password and is a member of its organisation only)."""

    organisation = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, related_name="service_accounts"
    )
    name = models.SlugField(max_length=50)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="service_account"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "service_accounts"
        constraints = [
            models.UniqueConstraint(
                fields=["organisation", "name"], name="service_accounts_org_name_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.organisation.slug}:{self.name}"


class Scope(models.TextChoices):
    JOBS_READ = "jobs:read"
    JOBS_WRITE = "jobs:write"
    JOBS_CANCEL = "jobs:cancel"
    ADMIN_DLQ = "admin:dlq"
    # An organisation admin's webhook endpoints (docs/webhooks.md).
    WEBHOOKS_MANAGE = "webhooks:manage"


ALL_SCOPES: tuple[str, ...] = tuple(Scope.values)


def all_scopes() -> list[str]:
    return list(ALL_SCOPES)


class ApiToken(models.Model):
    """A personal or service token with an expiry and scopes.

    Only the key's sha256 is stored: the key is shown once, when it is made. A service
    token's user is its service account, a member of its organisation only. The older
    one-per-user tokens (DRF's authtoken) keep working with every scope and no expiry
    until they are rotated into one of these.
    """

    name = models.CharField(max_length=100)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    # The key's first characters, to tell tokens apart in lists (not secret enough to use).
    prefix = models.CharField(max_length=12)
    digest = models.CharField(max_length=64, unique=True)
    scopes = ArrayField(models.CharField(max_length=16, choices=Scope.choices), default=all_scopes)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "api_tokens"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class OperatorScope(models.Model):
    """A staff member limited to some organisations: the portal and the admin API show
    them only those organisations' jobs, dead letters and counts. Staff without one
    (and every superuser) see all organisations."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="operator_scope"
    )
    organisations = models.ManyToManyField(Organisation, related_name="+", blank=True)

    class Meta:
        db_table = "operator_scopes"
        verbose_name = "operator's organisations"
        verbose_name_plural = "operators' organisations"

    def __str__(self) -> str:
        return f"{self.user} limited"
