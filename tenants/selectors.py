"""Reads for tenancy: what a caller may see, and in which organisation a job goes.

A caller's `Viewer` is computed once per request from its memberships (and, for staff
with staff powers, their operator scope); every job read filters by it, in SQL.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model

from audit.models import ActorType
from audit.services import Actor
from core.db import execute_prepared
from tenants.exceptions import NoOrganisationError, TenantInvalidError, TenantSuspendedError
from tenants.models import (
    OperatorScope,
    Organisation,
    Project,
    Role,
)
from tenants.queries import QUERIES

_CACHE_ATTR = "_jobops_memberships"
_SERVICE_CACHE_ATTR = "_jobops_service"


@dataclass(frozen=True)
class Viewer:
    """Which jobs a caller sees (docs/tenancy.md#visibility): every job (`everything`,
    unrestricted staff); every job of the organisations in `orgs` (staff limited to
    those by an operator scope); and, through its memberships, its own jobs in each of
    its organisations and every job of those it administers or that share visibility.

    A one-job read asks the membership part inside its statement (jobs/queries.sql
    job_read: one round trip); a list reads the memberships first (`org_sets`), so that
    its filter holds constants the planner can match to an index."""

    user: Any = field(repr=False, compare=False)
    everything: bool = False
    orgs: tuple[int, ...] = ()

    @property
    def owner_id(self) -> Any:
        return self.user.pk

    def sql_params(self) -> dict[str, Any]:
        """The parameters of the visibility condition the job statements repeat
        (jobs/queries.sql)."""
        return {"everything": self.everything, "orgs": list(self.orgs), "owner": self.owner_id}

    def org_sets(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(wide, own): the organisations whose every job it sees, and those where it
        sees only its own."""
        memberships = memberships_of(self.user)
        wide = set(self.orgs) | {
            m.org_id for m in memberships if m.role == Role.ADMIN or m.shared_visibility
        }
        own = {m.org_id for m in memberships} - wide
        return tuple(sorted(wide)), tuple(sorted(own))


@dataclass(frozen=True)
class MembershipRow:
    org_id: int
    slug: str
    role: str
    shared_visibility: bool
    suspended: bool


def memberships_of(user: Any) -> list[MembershipRow]:
    """The user's organisations (cached on the user object for the request, with
    whether it is a service account: one statement answers both)."""
    cached = getattr(user, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    rows = execute_prepared(QUERIES["caller_memberships"], {"user_id": user.pk})
    memberships = [
        MembershipRow(
            org_id=org_id, slug=slug, role=role, shared_visibility=shared, suspended=suspended
        )
        for _service, org_id, slug, role, shared, suspended in rows
        if org_id is not None
    ]
    setattr(user, _CACHE_ATTR, memberships)
    setattr(user, _SERVICE_CACHE_ATTR, bool(rows[0][0]))
    return memberships


_SCOPE_CACHE_ATTR = "_jobops_operator_org_ids"
_UNREAD = object()


def operator_may(user: Any, permission: str) -> bool:
    """Whether `user` may act as an operator with `permission` (a replay, a discard, a
    cancel by filter, a fix-forward, a re-run): active staff holding it. Which jobs it
    may act on is `operator_org_ids`."""
    return bool(
        user is not None
        and getattr(user, "is_active", False)
        and getattr(user, "is_staff", False)
        and user.has_perm(permission)
    )


def operator_org_ids(user: Any) -> tuple[int, ...] | None:
    """The organisations a staff member is limited to; None: not limited (superusers
    never are)."""
    if getattr(user, "is_superuser", False):
        return None
    # Cached on the user object for the request, as memberships_of: one page asks
    # several times (the dashboard's panels, its controls, the menu).
    cached = getattr(user, _SCOPE_CACHE_ATTR, _UNREAD)
    if cached is not _UNREAD:
        return cached  # type: ignore[return-value]
    scope = OperatorScope.objects.filter(user_id=user.pk).first()
    limited = (
        None if scope is None else tuple(sorted(scope.organisations.values_list("id", flat=True)))
    )
    setattr(user, _SCOPE_CACHE_ATTR, limited)
    return limited


def viewer_for(user: Any, *, staff: bool = False) -> Viewer:
    """What `user` sees; `staff`: the caller holds staff powers (verified staff that
    reads jobs), which reach every organisation unless an operator scope limits them."""
    if staff:
        limited = operator_org_ids(user)
        if limited is None:
            return Viewer(user=user, everything=True)
        return Viewer(user=user, orgs=limited)
    return Viewer(user=user)


def administers(user: Any, org_id: int) -> bool:
    """Whether `user` is an admin of the organisation."""
    return any(m.org_id == org_id and m.role == Role.ADMIN for m in memberships_of(user))


def operator_organisations(user: Any) -> list[Organisation]:
    """The organisations the portal shows a staff member, by slug: all of them, or
    those an operator scope limits them to (their filters offer no other)."""
    org_ids = operator_org_ids(user)
    orgs = Organisation.objects.order_by("slug")
    return list(orgs if org_ids is None else orgs.filter(id__in=org_ids))


@dataclass(frozen=True)
class Placement:
    """Where a new job goes: its organisation and (optional) project."""

    org_id: int
    project_id: int | None = None


def placement_for(user: Any, *, org: str | None = None, project: str | None = None) -> Placement:
    """The organisation (and project) a job of `user` goes in (docs/tenancy.md).

    A caller in one organisation needs to name none; a caller in several names one by
    slug. A project must belong to the organisation. A suspended organisation takes no
    new jobs (403 ERR-TENANT-SUSPENDED)."""
    memberships = memberships_of(user)
    if not memberships:
        raise NoOrganisationError()
    if org is None:
        if len(memberships) > 1:
            slugs = ", ".join(sorted(m.slug for m in memberships))
            raise TenantInvalidError(
                "You belong to several organisations: name one.",
                details={"org": [f"One of: {slugs}."]},
            )
        chosen: MembershipRow | None = memberships[0]
    else:
        chosen = next((m for m in memberships if m.slug == org), None)
        if chosen is None:
            raise TenantInvalidError(
                f"{org!r} is not an organisation of yours.",
                details={"org": ["Not an organisation you belong to."]},
            )
    assert chosen is not None
    if chosen.suspended:
        raise TenantSuspendedError(details={"org": chosen.slug})
    project_id = None
    if project is not None:
        project_id = (
            Project.objects.filter(organisation_id=chosen.org_id, slug=project)
            .values_list("id", flat=True)
            .first()
        )
        if project_id is None:
            raise TenantInvalidError(
                f"{project!r} is not a project of {chosen.slug}.",
                details={"project": [f"Not a project of {chosen.slug}."]},
            )
    return Placement(org_id=chosen.org_id, project_id=project_id)


def organisation_get(slug: str) -> Organisation | None:
    return Organisation.objects.filter(slug=slug).first()


def is_service_account(user: Any) -> bool:
    """Whether `user` is an organisation's service account (cached on the user, read
    with its memberships)."""
    cached = getattr(user, _SERVICE_CACHE_ATTR, None)
    if cached is None:
        memberships_of(user)
        cached = getattr(user, _SERVICE_CACHE_ATTR)
    return bool(cached)


def actor_for(user: Any) -> Actor:
    """Who an audit entry names for what `user` did through the API: a person
    (`user`) or an organisation's service account (`service`)."""
    if is_service_account(user):
        return Actor(ActorType.SERVICE, str(user.pk))
    return Actor.user(user)


# How the portal names an actor type; a type not named here (system, api_key) is shown
# as "type: id", its id being a component's name.
_ACTOR_NOUNS: dict[str, str] = {
    ActorType.USER: "user",
    ActorType.OPERATOR: "operator",
    ActorType.SERVICE: "service account",
}


def actor_labels(actors: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Each (actor_type, actor_id) of audit entries named for a person, in one query
    whatever their number: a user by username, an operator "operator <username>", a
    service account "service account <name>" (a full name, when the user has one, in
    brackets); the system's parts as "system: <name>". An id whose user is gone reads
    "<noun> #<id> (deleted)".

    The chain keeps only ids (personal data stays out of what is hashed); names are
    resolved here, at display time."""
    wanted = set(actors)
    ids = {pk for t, i in wanted if t in _ACTOR_NOUNS and (pk := _user_pk(i)) is not None}
    found = {
        pk: (username, f"{first} {last}".strip(), service)
        for pk, username, first, last, service in get_user_model()
        .objects.filter(pk__in=ids)
        .values_list("pk", "username", "first_name", "last_name", "service_account__name")
    }
    labels = {}
    for kind, actor_id in wanted:
        noun = _ACTOR_NOUNS.get(kind)
        if noun is None:
            labels[(kind, actor_id)] = f"{kind}: {actor_id}"
            continue
        pk = _user_pk(actor_id)
        user = found.get(pk) if pk is not None else None
        if user is None:
            labels[(kind, actor_id)] = f"{noun} #{actor_id} (deleted)"
            continue
        username, full_name, service = user
        if kind == ActorType.SERVICE:
            name = f"{noun} {service or username}"
        else:
            name = username + (f" ({full_name})" if full_name else "")
            name = name if kind == ActorType.USER else f"{noun} {name}"
        labels[(kind, actor_id)] = name
    return labels


def _user_pk(actor_id: str) -> int | None:
    """The user's primary key an actor id names; None for one no key can be (a bigint has
    at most 19 digits: a longer "id" would fail the query, not just find nobody)."""
    return (
        int(actor_id) if actor_id.isascii() and actor_id.isdigit() and len(actor_id) < 19 else None
    )
