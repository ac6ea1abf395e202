"""`manage.py org ...`: organisations, members, service tokens (docs/tenancy.md).

    manage.py org create SLUG [--name NAME]
    manage.py org project SLUG PROJECT [--name NAME]
    manage.py org add-member SLUG USERNAME [--role member|admin]
    manage.py org suspend SLUG
    manage.py org resume SLUG
    manage.py org token SLUG NAME [--scopes jobs:read,jobs:write] [--expires-in 90d|never]
                                  [--quiet]
    manage.py org token-revoke PREFIX
    manage.py org rotate USERNAME [--expires-in 90d|never] [--quiet]   (a person's token)
    manage.py org list
    manage.py org tokens [SLUG]
    manage.py org bootstrap

Every change goes through tenants.services and is audited on the ops chain (actor
`system:manage.py`). A token's key is printed once: it is not stored.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_slug
from django.db.models import Count
from django.utils import timezone

from core.durations import parse_duration
from core.errors import ApplicationError
from tenants.models import ApiToken, Organisation, Role, Scope
from tenants.services import (
    IssuedToken,
    default_organisation_ensure,
    member_add,
    organisation_create,
    organisation_resume,
    organisation_suspend,
    person_token_issue,
    project_create,
    service_account_get_or_create,
    token_create,
    token_revoke,
)

# A service token's scopes unless told: everything a job client does, not the admin API.
DEFAULT_SCOPES = (Scope.JOBS_READ, Scope.JOBS_WRITE, Scope.JOBS_CANCEL)


class Command(BaseCommand):
    help = "Manage organisations, their members and service tokens (docs/tenancy.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = sub.add_parser("create", help="create an organisation")
        create.add_argument("slug")
        create.add_argument("--name", default="", help="its display name (default: the slug)")
        project = sub.add_parser("project", help="create a project in an organisation")
        project.add_argument("slug")
        project.add_argument("project", help="the project's slug")
        project.add_argument("--name", default="", help="its display name (default: the slug)")
        member = sub.add_parser("add-member", help="add a user (or change their role)")
        member.add_argument("slug")
        member.add_argument("username")
        member.add_argument("--role", default=Role.MEMBER, choices=Role.values)
        for name, what in (
            ("suspend", "refuse new jobs and hold waiting ones"),
            ("resume", "end a suspension"),
        ):
            sub.add_parser(name, help=what).add_argument("slug")
        token = sub.add_parser("token", help="print a new token of a service account")
        token.add_argument("slug")
        token.add_argument("name", help="the service account (made if missing)")
        token.add_argument(
            "--scopes",
            default=",".join(DEFAULT_SCOPES),
            help=f"comma-separated, of: {', '.join(Scope.values)} (default: the jobs:* ones)",
        )
        self._expiry_argument(token)
        token.add_argument("--quiet", action="store_true", help="print the key alone")
        revoke = sub.add_parser("token-revoke", help="revoke a token by its prefix")
        revoke.add_argument("prefix")
        rotate = sub.add_parser(
            "rotate",
            help="a person's token: replaces their legacy token, or makes one if they have "
            "none (every scope they may hold: admin:dlq for staff only)",
        )
        rotate.add_argument("username")
        self._expiry_argument(rotate)
        rotate.add_argument("--quiet", action="store_true", help="print the key alone")
        listing = sub.add_parser("list", help="organisations with members and state")
        listing.add_argument("--json", action="store_true")
        tokens = sub.add_parser("tokens", help="API tokens (of one organisation's members)")
        tokens.add_argument("slug", nargs="?")
        sub.add_parser(
            "bootstrap", help="the default organisation, with superusers in none as its admins"
        )

    @staticmethod
    def _expiry_argument(parser: CommandParser) -> None:
        parser.add_argument(
            "--expires-in",
            default=None,
            help="a duration (90d, 12h) or 'never' (default: JOBOPS_TOKEN_DEFAULT_TTL)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"].replace("-", "_")
        try:
            getattr(self, f"_{action}")(options)
        except ApplicationError as exc:
            details = f" {json.dumps(exc.details)}" if exc.details else ""
            raise CommandError(f"{exc.code}: {exc.message}{details}") from exc

    # --- lookups ------------------------------------------------------------------

    def _org(self, slug: str) -> Organisation:
        org = Organisation.objects.filter(slug=slug).first()
        if org is None:
            known = ", ".join(Organisation.objects.values_list("slug", flat=True)) or "none"
            raise CommandError(f"No organisation {slug!r} (known: {known}).")
        return org

    def _user(self, username: str) -> Any:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username!r}.")
        return user

    def _expires_at(self, text: str | None) -> datetime | None:
        if text == "never":
            return None
        try:
            ttl = settings.JOBOPS_TOKEN_DEFAULT_TTL if text is None else parse_duration(text)
        except ValueError as exc:
            raise CommandError(f"--expires-in: {exc}") from exc
        if not ttl:
            raise CommandError("--expires-in: a token must live a while (or say 'never').")
        return timezone.now() + ttl

    def _print_key(self, issued: IssuedToken, options: dict[str, Any]) -> None:
        if options["quiet"]:
            self.stdout.write(issued.key)
            return
        token = issued.token
        expiry = token.expires_at.isoformat() if token.expires_at else "never"
        self.stdout.write(self.style.SUCCESS(f"Token {token.prefix}… (shown once):"))
        self.stdout.write(f"  key:     {issued.key}")
        self.stdout.write(f"  user:    {token.user.get_username()}")
        self.stdout.write(f"  scopes:  {' '.join(token.scopes)}")
        self.stdout.write(f"  expires: {expiry}")
        self.stdout.write(f"  use:     Authorization: Token {issued.key}")

    # --- actions ------------------------------------------------------------------

    def _create(self, options: dict[str, Any]) -> None:
        try:
            validate_slug(options["slug"])
        except ValidationError as exc:
            raise CommandError(f"{options['slug']!r}: {' '.join(exc.messages)}") from exc
        org = organisation_create(slug=options["slug"], name=options["name"])
        self.stdout.write(f"created organisation {org.slug} ({org.name})")

    def _project(self, options: dict[str, Any]) -> None:
        org = self._org(options["slug"])
        try:
            validate_slug(options["project"])
        except ValidationError as exc:
            raise CommandError(f"{options['project']!r}: {' '.join(exc.messages)}") from exc
        project = project_create(org=org, slug=options["project"], name=options["name"])
        self.stdout.write(f"created project {project} ({project.name})")

    def _add_member(self, options: dict[str, Any]) -> None:
        org = self._org(options["slug"])
        user = self._user(options["username"])
        member_add(org=org, user=user, role=options["role"])
        article = "an" if options["role"][0] in "aeiou" else "a"
        self.stdout.write(f"{user.get_username()} is {article} {options['role']} of {org.slug}")

    def _suspend(self, options: dict[str, Any]) -> None:
        org = self._org(options["slug"])
        changed = organisation_suspend(org=org)
        self.stdout.write(f"suspended {org.slug}" if changed else f"{org.slug} was suspended")

    def _resume(self, options: dict[str, Any]) -> None:
        org = self._org(options["slug"])
        changed = organisation_resume(org=org)
        self.stdout.write(f"resumed {org.slug}" if changed else f"{org.slug} was not suspended")

    def _token(self, options: dict[str, Any]) -> None:
        org = self._org(options["slug"])
        try:
            validate_slug(options["name"])
        except ValidationError as exc:
            raise CommandError(f"{options['name']!r}: {' '.join(exc.messages)}") from exc
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        expires_at = self._expires_at(options["expires_in"])
        account, created = service_account_get_or_create(org=org, name=options["name"])
        if created and not options["quiet"]:
            self.stdout.write(f"created service account {account}")
        issued = token_create(
            user=account.user, name=options["name"], scopes=scopes, expires_at=expires_at
        )
        self._print_key(issued, options)

    def _token_revoke(self, options: dict[str, Any]) -> None:
        matches = list(ApiToken.objects.filter(prefix__startswith=options["prefix"])[:2])
        if not matches:
            raise CommandError(f"No token with the prefix {options['prefix']!r}.")
        if len(matches) > 1:
            raise CommandError(f"Several tokens start with {options['prefix']!r}: give more.")
        changed = token_revoke(token=matches[0])
        prefix = matches[0].prefix
        self.stdout.write(f"revoked {prefix}…" if changed else f"{prefix}… was revoked already")

    def _rotate(self, options: dict[str, Any]) -> None:
        user = self._user(options["username"])
        issued, rotated = person_token_issue(
            user=user, expires_at=self._expires_at(options["expires_in"])
        )
        if not rotated and not options["quiet"]:
            self.stdout.write(
                f"{user.get_username()} had no legacy token: this is a new one "
                "(their other tokens keep working; `org tokens` lists them)."
            )
        self._print_key(issued, options)

    def _list(self, options: dict[str, Any]) -> None:
        orgs = Organisation.objects.annotate(
            members=Count("memberships", distinct=True),
            projects_count=Count("projects", distinct=True),
        )
        rows = [
            {
                "slug": o.slug,
                "name": o.name,
                "members": o.members,
                "projects": o.projects_count,
                "suspended_at": o.suspended_at.isoformat() if o.suspended_at else None,
            }
            for o in orgs
        ]
        if options["json"]:
            self.stdout.write(json.dumps(rows))
            return
        self.stdout.write(f"{'slug':<20} {'members':>7} {'projects':>8}  state      name")
        for row in rows:
            state = "suspended" if row["suspended_at"] else "active"
            self.stdout.write(
                f"{row['slug']:<20} {row['members']:>7} {row['projects']:>8}  "
                f"{state:<10} {row['name']}"
            )

    def _tokens(self, options: dict[str, Any]) -> None:
        tokens = ApiToken.objects.select_related("user").order_by("-created_at")
        if options["slug"]:
            org = self._org(options["slug"])
            tokens = tokens.filter(user__memberships__organisation=org)
        now = timezone.now()
        self.stdout.write(f"{'prefix':<12} {'user':<28} {'state':<8} {'expires':<20} scopes")
        for t in tokens:
            if t.revoked_at:
                state = "revoked"
            elif t.expires_at and t.expires_at <= now:
                state = "expired"
            else:
                state = "active"
            expires = t.expires_at.strftime("%Y-%m-%d %H:%M") if t.expires_at else "never"
            self.stdout.write(
                f"{t.prefix:<12} {t.user.get_username():<28} {state:<8} {expires:<20} "
                f"{','.join(t.scopes)}"
            )

    def _bootstrap(self, options: dict[str, Any]) -> None:
        org, added = default_organisation_ensure()
        for user in added:
            self.stdout.write(f"{user.get_username()} is an admin of {org.slug}")
        if not added:
            self.stdout.write(f"organisation {org.slug} ready; nothing to add")
