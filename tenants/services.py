"""Writes for tenancy: organisations, members, service accounts and API tokens
(docs/tenancy.md).

Every change is audited on the ops chain in the same transaction, naming who made it
(an operator in the admin, `system` for a management command). A token's key is
returned once, by the service that makes it; only its sha256 and a short prefix are
stored.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from rest_framework.authtoken.models import Token

from audit.services import OPS_CHAIN, Actor, audit_append
from core.api.authentication import key_digest
from core.errors import ApplicationError
from tenants.models import (
    ALL_SCOPES,
    DEFAULT_ORG_SLUG,
    ApiToken,
    Membership,
    Organisation,
    Project,
    Role,
    Scope,
    ServiceAccount,
)

# `key_digest` is what is stored of a key and what a presented key is looked up by; OTP
# grants are keyed by the same digest (core/api/otp.py): one function makes both.
# Every key starts so: a leaked key is recognisable (secret scanners, logs), and the
# authenticator tells it from a legacy DRF token (40 hex digits) without a query.
KEY_PREFIX = "jo_"
# The characters of a key kept to tell tokens apart in lists: "jo_" and 8 of the
# random part (48 bits: identifies, cannot be used).
PREFIX_LENGTH = len(KEY_PREFIX) + 8
SYSTEM = Actor.system("manage.py")


class TenancyInputError(ApplicationError):
    """A tenancy change refused for what was asked (a taken slug, an unknown scope)."""

    code = "ERR-TENANT-400"
    http_status = 400


def _audit(event_type: str, actor: Actor, **data: Any) -> None:
    audit_append(chain=OPS_CHAIN, event_type=event_type, actor=actor, data=data)


def organisation_create(*, slug: str, name: str = "", actor: Actor = SYSTEM) -> Organisation:
    with transaction.atomic():
        if Organisation.objects.filter(slug=slug).exists():
            raise TenancyInputError(f"An organisation {slug!r} exists already.")
        org = Organisation.objects.create(slug=slug, name=name or slug)
        _audit("org_created", actor, org_id=org.pk, slug=slug)
    return org


def member_add(
    *, org: Organisation, user: Any, role: str = Role.MEMBER, actor: Actor = SYSTEM
) -> Membership:
    """Make `user` a member of `org` with `role`, or change the role they have."""
    if role not in Role.values:
        raise TenancyInputError(f"{role!r} is not a role; one of: {', '.join(Role.values)}.")
    with transaction.atomic():
        membership, created = Membership.objects.update_or_create(
            user=user, organisation=org, defaults={"role": role}
        )
        _audit(
            "org_member_added" if created else "org_member_role_set",
            actor,
            org_id=org.pk,
            user_id=user.pk,
            role=role,
        )
    return membership


def member_remove(*, membership: Membership, actor: Actor = SYSTEM) -> None:
    with transaction.atomic():
        org_id, user_id = membership.organisation_id, membership.user_id
        membership.delete()
        _audit("org_member_removed", actor, org_id=org_id, user_id=user_id)


def project_save(*, project: Project, actor: Actor = SYSTEM) -> Project:
    """Create or rename a project (the admin's inline form hands it over unsaved)."""
    with transaction.atomic():
        created = project.pk is None
        project.save()
        _audit(
            "project_created" if created else "project_changed",
            actor,
            org_id=project.organisation_id,
            project_id=project.pk,
            slug=project.slug,
        )
    return project


def project_create(
    *, org: Organisation, slug: str, name: str = "", actor: Actor = SYSTEM
) -> Project:
    """A new project of `org` (`manage.py org project`); a slug the organisation has
    already is refused (the admin's form says so on its own)."""
    with transaction.atomic():
        if Project.objects.filter(organisation=org, slug=slug).exists():
            raise TenancyInputError(f"{org.slug} has a project {slug!r} already.")
        return project_save(
            project=Project(organisation=org, slug=slug, name=name or slug), actor=actor
        )


def organisation_suspend(*, org: Organisation, actor: Actor = SYSTEM) -> bool:
    """Suspend `org`: new jobs are refused, waiting ones held. False if it already was
    (compare-and-set: of two operators suspending at once, one records it)."""
    with transaction.atomic():
        now = timezone.now()
        changed = Organisation.objects.filter(pk=org.pk, suspended_at__isnull=True).update(
            suspended_at=now
        )
        if changed:
            org.suspended_at = now
            _audit("org_suspended", actor, org_id=org.pk, slug=org.slug)
    return bool(changed)


def organisation_resume(*, org: Organisation, actor: Actor = SYSTEM) -> bool:
    """Resume `org`; False if it was not suspended."""
    with transaction.atomic():
        changed = Organisation.objects.filter(pk=org.pk, suspended_at__isnull=False).update(
            suspended_at=None
        )
        if changed:
            org.suspended_at = None
            _audit("org_resumed", actor, org_id=org.pk, slug=org.slug)
    return bool(changed)


def default_organisation_ensure(*, actor: Actor = SYSTEM) -> tuple[Organisation, list[Any]]:
    """The default organisation (made if missing), with every superuser who belongs to
    no organisation made its admin (`make run`'s first administrator); returns the
    users added."""
    with transaction.atomic():
        org = Organisation.objects.filter(slug=DEFAULT_ORG_SLUG).first()
        if org is None:
            org = organisation_create(
                slug=DEFAULT_ORG_SLUG, name="Default organisation", actor=actor
            )
        homeless = list(
            get_user_model()
            .objects.filter(is_superuser=True, memberships__isnull=True)
            .order_by("pk")
        )
        for user in homeless:
            member_add(org=org, user=user, role=Role.ADMIN, actor=actor)
    return org, homeless


def service_account_create(
    *, org: Organisation, name: str, actor: Actor = SYSTEM
) -> ServiceAccount:
    """An organisation's API identity: a user nobody logs in as (no usable password),
    member of `org` only, named `svc-<org>-<name>`."""
    with transaction.atomic():
        if ServiceAccount.objects.filter(organisation=org, name=name).exists():
            raise TenancyInputError(f"{org.slug} has a service account {name!r} already.")
        username = f"svc-{org.slug}-{name}"[:150]
        user_model = get_user_model()
        if user_model.objects.filter(username=username).exists():
            raise TenancyInputError(f"The username {username!r} is taken.")
        user = user_model.objects.create_user(username=username)  # unusable password
        account = ServiceAccount.objects.create(organisation=org, name=name, user=user)
        Membership.objects.create(user=user, organisation=org, role=Role.MEMBER)
        _audit("service_account_created", actor, org_id=org.pk, name=name, user_id=user.pk)
    return account


def service_account_get_or_create(
    *, org: Organisation, name: str, actor: Actor = SYSTEM
) -> tuple[ServiceAccount, bool]:
    existing = ServiceAccount.objects.filter(organisation=org, name=name).first()
    if existing is not None:
        return existing, False
    return service_account_create(org=org, name=name, actor=actor), True


@dataclass(frozen=True)
class IssuedToken:
    """A new token and its key: the key exists only here, shown once."""

    token: ApiToken
    key: str


def scopes_allowed(user: Any) -> list[str]:
    """The scopes a token of `user` may hold, and what it gets when none are named:
    `admin:dlq` opens the operators' API, so only staff get it. The DLQ views check staff
    too, but a member's token must not become an operator's the day they are made staff.
    `webhooks:manage` likewise goes only to an admin of some organisation (or staff): the
    webhook calls check the admin role as well."""
    admin_of_some = user.is_staff or Membership.objects.filter(user=user, role=Role.ADMIN).exists()
    return [
        s
        for s in ALL_SCOPES
        if (s != Scope.ADMIN_DLQ or user.is_staff) and (s != Scope.WEBHOOKS_MANAGE or admin_of_some)
    ]


def token_scopes_check(*, user: Any, scopes: list[str] | tuple[str, ...] | None) -> list[str]:
    """`scopes` checked for a token of `user` (None: every scope `user` may hold), in the
    order of Scope, once each; TenancyInputError names what is wrong."""
    allowed = scopes_allowed(user)
    if scopes is None:
        return allowed
    unknown = sorted(set(scopes) - set(ALL_SCOPES))
    if unknown:
        raise TenancyInputError(
            f"Unknown scope(s): {', '.join(unknown)}; known: {', '.join(ALL_SCOPES)}."
        )
    if not scopes:
        raise TenancyInputError("A token needs at least one scope.")
    refused = [s for s in ALL_SCOPES if s in scopes and s not in allowed]
    if Scope.ADMIN_DLQ in refused:
        raise TenancyInputError(
            f"{Scope.ADMIN_DLQ} is for staff tokens: {user.get_username()} is not staff."
        )
    if refused:
        raise TenancyInputError(
            f"{', '.join(refused)} is for organisation admins: {user.get_username()} "
            "administers no organisation."
        )
    # In the order of Scope, once each: lists and the audit read the same.
    return [s for s in ALL_SCOPES if s in scopes]


def _new_key() -> tuple[str, str, str]:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, key[:PREFIX_LENGTH], key_digest(key)


def token_create(
    *,
    user: Any,
    name: str,
    scopes: list[str] | tuple[str, ...] | None = None,
    expires_at: datetime | None = None,
    actor: Actor = SYSTEM,
) -> IssuedToken:
    """A token for `user` (a person, or a service account's user) with `scopes` (by
    default every scope `user` may hold: `scopes_allowed`) until `expires_at` (None: no
    expiry). Returns the key, which is not stored."""
    checked = token_scopes_check(user=user, scopes=scopes)
    if expires_at is not None and expires_at <= timezone.now():
        raise TenancyInputError("The expiry is in the past.")
    key, prefix, digest = _new_key()
    with transaction.atomic():
        token = ApiToken.objects.create(
            name=name,
            user=user,
            prefix=prefix,
            digest=digest,
            scopes=checked,
            expires_at=expires_at,
        )
        _audit(
            "token_created",
            actor,
            token_id=token.pk,
            user_id=user.pk,
            prefix=prefix,
            scopes=checked,
            expires_at=expires_at.isoformat() if expires_at else None,
        )
    return IssuedToken(token=token, key=key)


def token_revoke(*, token: ApiToken, actor: Actor = SYSTEM) -> bool:
    """Revoke `token` at once (its next request is 401); False if it already was."""
    with transaction.atomic():
        now = timezone.now()
        changed = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=now
        )
        if changed:
            token.revoked_at = now
            _audit("token_revoked", actor, token_id=token.pk, prefix=token.prefix)
    return bool(changed)


def legacy_token_rotate(
    *, user: Any, name: str = "rotated", expires_at: datetime | None = None, actor: Actor = SYSTEM
) -> IssuedToken:
    """Replace `user`'s legacy DRF token (every scope, no expiry) with an ApiToken of
    every scope `user` may hold (`scopes_allowed`: `admin:dlq` for staff only) expiring at
    `expires_at`; the old key stops working in the same transaction, so there is no
    moment with neither or both."""
    with transaction.atomic():
        deleted, _ = Token.objects.filter(user=user).delete()
        if not deleted:
            raise TenancyInputError(f"{user.get_username()} has no legacy token to rotate.")
        issued = token_create(user=user, name=name, scopes=None, expires_at=expires_at, actor=actor)
        _audit("legacy_token_rotated", actor, user_id=user.pk, token_id=issued.token.pk)
    return issued


def person_token_issue(
    *, user: Any, expires_at: datetime | None = None, actor: Actor = SYSTEM
) -> tuple[IssuedToken, bool]:
    """A person's token (`manage.py org rotate`), with every scope they may hold.

    1. A user with a legacy token has it rotated (`legacy_token_rotate`); True.
    2. Otherwise a new token named `personal`; their other tokens keep working. False.
       A user who is not staff and belongs to no organisation is refused: every job call
       of the token would be 403, so the answer says what to do first.
    """
    with transaction.atomic():
        if Token.objects.filter(user=user).exists():
            return legacy_token_rotate(user=user, expires_at=expires_at, actor=actor), True
        if not user.is_staff and not Membership.objects.filter(user=user).exists():
            raise TenancyInputError(
                f"{user.get_username()} belongs to no organisation: add them first "
                f"(manage.py org add-member SLUG {user.get_username()})."
            )
        issued = token_create(user=user, name="personal", expires_at=expires_at, actor=actor)
    return issued, False


def last_used_touch(*, token_id: int, now: datetime, older_than: datetime) -> None:
    """Record that a token was used, unless that was recorded after `older_than`: a
    busy token writes its row about once a minute, not on every request. Not audited:
    it is bookkeeping, not a change of what the token may do."""
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=older_than)
    ApiToken.objects.filter(stale, pk=token_id).update(last_used_at=now)
