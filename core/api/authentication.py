"""Token authentication in one prepared statement.

DRF's TokenAuthentication reads the token and its user through the ORM on every API
request; building that query cost more than running it (about a millisecond of a GET
that is otherwise two). Same answers, same errors: only the read is prepared.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.contrib.auth import get_user_model
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

from core.db import execute_prepared, model_from_row
from core.queries import QUERIES


def key_digest(key: str) -> str:
    """The sha256 of a token's key: what tenancy stores of its tokens (and looks them
    up by), and what OTP grants are keyed by (core/api/otp.py)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class TokenAuthentication(authentication.TokenAuthentication):
    def authenticate_credentials(self, key: str) -> tuple[Any, Token]:
        # No stored key is longer or holds a NUL (PostgreSQL text cannot): not a query.
        if len(key) > Token._meta.get_field("key").max_length or "\x00" in key:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        rows = execute_prepared(QUERIES["token_with_user"], {"key": key})
        if not rows:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        # The token's columns, then the user's (whose names may repeat a token's).
        width = len(Token._meta.concrete_fields)
        token = model_from_row(Token, rows[0][:width], rows.columns[:width])
        user = model_from_row(get_user_model(), rows[0][width:], rows.columns[width:])
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        Token.user.field.set_cached_value(token, user)
        return user, token
