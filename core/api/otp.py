"""OTP grants: `POST /api/v1/admin/otp` trades a current TOTP code for 15 minutes of
admin API access, bound to the caller's API token (docs/api.md#admin-calls-and-the-otp-grant).

django-otp accepts each TOTP time step once (`TOTPDevice.last_t`), so a code cannot ride
along on every call of a script; the script exchanges one for a grant instead. The
grant lives in the cache (Redis, or core/kv.py's table with JOBOPS_REDIS off) under the
sha256 of the token's key (`token_digest`: a legacy DRF token's key hashed here, a
tenancy ApiToken's stored digest, the same value for the same key):
- deleting or rotating the token ends it (a new token has no grant);
- it names the user, and is honoured only for that user while they are active staff;
- losing the cache loses grants: callers exchange a fresh code, nothing else breaks.
Only confirmed TOTP devices are accepted here; static backup tokens are for the login
page of someone who lost their phone, not for scripts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.core.cache import cache
from django.core.validators import RegexValidator
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django_otp.plugins.otp_totp.models import TOTPDevice
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.authtoken.models import Token
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.authentication import TokenAuthentication, key_digest
from core.api.docs import REQUEST_ID, ErrorTable, error_responses_from
from core.api.parsers import json_body
from core.api.serializers import ClosedSerializer, StrictCharField
from core.api.throttles import ThrottledApiView
from core.errors import ApplicationError
from core.otp_devices import verification_wait

log = structlog.get_logger("core.otp")


class OtpRefusedError(ApplicationError):
    code = "ERR-OTP-401"
    http_status = 401
    default_message = "The one-time code is wrong, expired or was used already."
    headers = {"WWW-Authenticate": 'Token realm="jobops admin"'}


class OtpNotAllowedError(ApplicationError):
    code = "ERR-OTP-403"
    http_status = 403
    default_message = (
        "OTP grants are for active staff with a confirmed TOTP device "
        "(a superuser enrolls one: manage.py otp_enroll USERNAME)."
    )


class OtpRateLimitedError(ApplicationError):
    code = "ERR-OTP-429"
    http_status = 429
    default_message = "Too many admin calls; retry after Retry-After seconds."

    def __init__(self, *, retry_after: int) -> None:
        super().__init__(details={"retry_after": retry_after})
        self.retry_after = retry_after


class OtpThrottledError(OtpRateLimitedError):
    default_message = (
        "Too many wrong codes in a row: codes are not checked for a while, even a "
        "correct one. Retry after Retry-After seconds."
    )


class OtpUnavailableError(ApplicationError):
    code = "ERR-OTP-503"
    http_status = 503
    default_message = "Grants cannot be stored right now (cache unavailable); retry shortly."
    retry_after = 5


@dataclass(frozen=True)
class OtpGrant:
    user_id: int
    device: str  # the device's persistent id
    expires_at: datetime


def token_digest(auth: Any) -> str | None:
    """The sha256 of the key of the token a request was authenticated with: a legacy
    DRF token's (its key is stored) or an ApiToken's (only its digest is); None for
    anything else (a session)."""
    if isinstance(auth, Token):
        return key_digest(auth.key)
    digest = getattr(auth, "digest", None)
    return digest if isinstance(digest, str) and digest else None


def _grant_key(digest: str) -> str:
    # A digest, so that the cache never holds a usable token.
    return "otp-grant:" + digest


def otp_grant_issue(*, user: Any, token_digest: str, otp_token: str) -> OtpGrant:
    """Verify a TOTP code of `user` and store a grant for the token of `token_digest`.

    1. Refuse anyone but active staff with a confirmed TOTP device (403).
    2. While django-otp throttles every device after wrong codes, say when to retry
       (429) rather than call a possibly correct code wrong.
    3. Verify the code against each device, rows locked: django-otp then accepts each
       time step once and counts failures for its own throttling. The refusal is
       raised after the transaction, so that the failure count is kept.
    4. Store the grant for JOBOPS_OTP_GRANT_SECONDS; a new grant replaces the old.
    """
    if not (user.is_active and user.is_staff):
        raise OtpNotAllowedError()
    matched = None
    with transaction.atomic():
        devices = TOTPDevice.objects.devices_for_user(user, confirmed=True).select_for_update()
        if not devices:
            raise OtpNotAllowedError()
        wait = verification_wait(devices)
        if wait is not None:
            raise OtpThrottledError(retry_after=wait)
        for device in devices:
            if device.verify_token(otp_token):
                matched = device
                break
    if matched is None:
        log.warning("otp_grant_refused", user_id=user.pk)
        raise OtpRefusedError()
    seconds = int(settings.JOBOPS_OTP_GRANT_SECONDS)
    grant = OtpGrant(
        user_id=user.pk,
        device=matched.persistent_id,
        expires_at=timezone.now() + timedelta(seconds=seconds),
    )
    value = {
        "user_id": grant.user_id,
        "device": grant.device,
        "expires_at": grant.expires_at.isoformat(),
    }
    try:
        cache.set(_grant_key(token_digest), value, seconds)
    except Exception as exc:  # cache down: say so rather than answer 500
        log.error("otp_grant_not_stored", error=repr(exc))
        raise OtpUnavailableError() from exc
    log.info("otp_grant_issued", user_id=user.pk, device=grant.device, seconds=seconds)
    return grant


def otp_grant_for(*, token_digest: str, user: Any) -> OtpGrant | None:
    """The live grant of this token for this user, or None (none, expired, other user,
    cache unavailable)."""
    try:
        value = cache.get(_grant_key(token_digest))
    except Exception as exc:  # no cache, no grant: the caller is answered 401
        log.warning("otp_grant_unreadable", error=repr(exc))
        return None
    if not isinstance(value, dict) or value.get("user_id") != user.pk:
        return None
    expires_at = parse_datetime(str(value.get("expires_at") or ""))
    if expires_at is None or expires_at <= timezone.now():
        return None
    return OtpGrant(user_id=user.pk, device=str(value.get("device")), expires_at=expires_at)


def otp_grant_revoke(*, token_digest: str) -> None:
    cache.delete(_grant_key(token_digest))


ERRORS: ErrorTable = {
    400: ('ERR-OTP-400: the body is not `{"otp_token": "123456"}`.', ["ERR-OTP-400"]),
    401: (
        "ERR-AUTH-401: no or invalid token (a grant binds to a token: send "
        "`Authorization: Token ...`). ERR-OTP-401: the code is wrong, expired or was used "
        "already (each 30-second code works once), or too many wrong codes in a row.",
        ["ERR-AUTH-401", "ERR-OTP-401"],
    ),
    403: ("ERR-OTP-403: not active staff, or no confirmed TOTP device.", ["ERR-OTP-403"]),
    415: ("ERR-HTTP-415: the body is not `application/json`.", ["ERR-HTTP-415"]),
    429: (
        "ERR-OTP-429: more than 30 admin calls a minute, or too many wrong codes in a row "
        "(codes are not checked until Retry-After seconds have passed).",
        ["ERR-OTP-429"],
    ),
    503: ("ERR-OTP-503: the grant could not be stored; retry.", ["ERR-OTP-503"]),
}


OTP_CODE_PATTERN = r"^[0-9]{6,8}$"


@extend_schema_field({"type": "string", "pattern": OTP_CODE_PATTERN})
class OtpCodeField(StrictCharField):
    """6 to 8 digits, as a string (a number would lose leading zeros)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(validators=[RegexValidator(OTP_CODE_PATTERN, "6 to 8 digits.")], **kwargs)


class OtpGrantApi(ThrottledApiView):
    """POST /api/v1/admin/otp: a current TOTP code -> a grant for this token."""

    authentication_classes = [TokenAuthentication]
    permission_classes = [IsAuthenticated]
    error_prefix = "ERR-OTP"
    rate_limited_error = OtpRateLimitedError

    class OtpGrantInputSerializer(ClosedSerializer):
        otp_token = OtpCodeField(help_text="The code your authenticator app shows now.")

    class OtpGrantOutputSerializer(serializers.Serializer):
        expires_at = serializers.DateTimeField(help_text="The grant ends then (15 minutes).")
        expires_in = serializers.IntegerField(help_text="Seconds until then.")

    @extend_schema(
        operation_id="admin_otp_grant",
        summary="Exchange a TOTP code for a 15-minute admin grant on this token",
        tags=["admin"],
        request=OtpGrantInputSerializer,
        parameters=[REQUEST_ID],
        responses={
            200: OpenApiResponse(
                OtpGrantOutputSerializer,
                "Granted: admin calls with this token count as OTP-verified until `expires_at`.",
            ),
            **error_responses_from(ERRORS, 400, 401, 403, 415, 429, 503),
        },
    )
    def post(self, request: Request) -> Response:
        given = self.OtpGrantInputSerializer(data=json_body(request))
        given.is_valid(raise_exception=True)
        code = given.validated_data["otp_token"]
        digest = token_digest(request.auth)
        if digest is None:  # only a token authenticator is allowed here: cannot happen
            raise OtpNotAllowedError("A grant binds to an API token.")
        grant = otp_grant_issue(user=request.user, token_digest=digest, otp_token=code)
        seconds = max(0, int((grant.expires_at - timezone.now()).total_seconds()))
        body = {"expires_at": grant.expires_at, "expires_in": seconds}
        return Response(self.OtpGrantOutputSerializer(body).data)
