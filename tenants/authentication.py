"""API token authentication: the expiring, scoped tokens of tenancy, and the legacy
ones (docs/tenancy.md#service-accounts-and-tokens).

`Authorization: Token <key>` or `Authorization: Bearer <key>`. A key that starts with
"jo_" is an `ApiToken`, read by the sha256 of the key in one prepared statement (its
unique index); any other key is a legacy DRF token (core's authenticator), which keeps
every scope and no expiry until it is rotated. `request.auth` is the token either way;
scopes are checked by `tenants.permissions.HasRequiredScope`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header
from rest_framework.request import Request

from core.api.authentication import TokenAuthentication as LegacyTokenAuthentication
from core.db import execute_prepared, model_from_row
from tenants.models import ApiToken
from tenants.queries import QUERIES
from tenants.services import KEY_PREFIX, key_digest, last_used_touch

KEYWORDS = (b"token", b"bearer")
# last_used_at is written at most this often per token: a token used a hundred times a
# second costs one UPDATE a minute, not a hundred a second.
LAST_USED_RESOLUTION = timedelta(seconds=60)
# No key made by tenants.services is longer; anything longer is refused unread.
MAX_KEY_LENGTH = 100


class TokenExpired(exceptions.AuthenticationFailed):
    """401 ERR-AUTH-401, saying the token expired (a DRF exception, so that DRF marks
    the request unauthenticated before the envelope is rendered)."""

    default_detail = _("This token has expired: ask for a new one.")


class TokenAuthentication(LegacyTokenAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        """DRF's header parsing, accepting the `Bearer` keyword as well as `Token`."""
        auth = get_authorization_header(request).split()
        if not auth or auth[0].lower() not in KEYWORDS:
            return None
        if len(auth) != 2:
            raise exceptions.AuthenticationFailed(
                _("Invalid token header: give one key after the keyword.")
            )
        try:
            key = auth[1].decode()
        except UnicodeError as exc:
            raise exceptions.AuthenticationFailed(
                _("Invalid token header. Token string should not contain invalid characters.")
            ) from exc
        return self.authenticate_credentials(key)

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        if not key.startswith(KEY_PREFIX):
            return super().authenticate_credentials(key)
        if len(key) > MAX_KEY_LENGTH or "\x00" in key:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        rows = execute_prepared(QUERIES["api_token_with_user"], {"digest": key_digest(key)})
        if not rows:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        width = len(ApiToken._meta.concrete_fields)
        token = model_from_row(ApiToken, rows[0][:width], rows.columns[:width])
        user = model_from_row(get_user_model(), rows[0][width:], rows.columns[width:])
        now = timezone.now()
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed(_("This token was revoked."))
        if token.expires_at is not None and token.expires_at <= now:
            raise TokenExpired()
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        ApiToken.user.field.set_cached_value(token, user)
        if token.last_used_at is None or token.last_used_at < now - LAST_USED_RESOLUTION:
            last_used_touch(token_id=token.pk, now=now, older_than=now - LAST_USED_RESOLUTION)
            token.last_used_at = now
        return user, token
