"""What tests build: users (factory_boy), jobs through the real services, API clients.

Jobs are never made with `Job.objects.create` or by writing a status: `make_job` and
`job_in_state` take the path a real job takes, so every job has its audit chain and
outbox events, and a test does not change when the services' internals do.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from audit.services import Actor
from jobs.domain.states import Status
from jobs.models import Job
from jobs.services import (
    WORKER,
    Fence,
    job_cancel,
    job_claim,
    job_create,
    job_fail_with_dead_letter,
    job_retry,
    job_succeed,
)
from jobs.services.transitions import change
from tenants.models import DEFAULT_ORG_SLUG, Membership, Organisation, Project


def default_org() -> Organisation:
    return Organisation.objects.get_or_create(
        slug=DEFAULT_ORG_SLUG, defaults={"name": "Default organisation"}
    )[0]


class OrganisationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Organisation
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"org{n}")
    name = factory.LazyAttribute(lambda o: f"Organisation {o.slug}")


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    organisation = factory.SubFactory(OrganisationFactory)
    slug = factory.Sequence(lambda n: f"project{n}")
    name = factory.LazyAttribute(lambda p: f"Project {p.slug}")


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")
    password = factory.django.Password("pw-for-tests")

    @factory.post_generation
    def org(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        """A member of `org` (an Organisation; by default the default organisation, made
        if a transactional test's flush removed it); `org=False`: of none."""
        if not create or extracted is False:
            return
        organisation = extracted if extracted is not None else default_org()
        Membership.objects.get_or_create(
            user=self, organisation=organisation, defaults={"role": kwargs.get("role", "member")}
        )


class StaffFactory(UserFactory):
    username = factory.Sequence(lambda n: f"staff{n}")
    is_staff = True


class OperatorFactory(StaffFactory):
    """Staff with the operator's permissions: read and cancel any job, replay and
    discard (the `operator` role's job powers; role_user("operator") has them all)."""

    username = factory.Sequence(lambda n: f"operator{n}")

    @factory.post_generation
    def operator_permissions(self, create: bool, extracted: object, **kwargs: object) -> None:
        from django.contrib.auth.models import Permission

        if create:
            self.user_permissions.add(
                *Permission.objects.filter(
                    codename__in=[
                        "view_job",
                        "cancel_job",
                        "replay_deadletter",
                        "discard_deadletter",
                        "pause_queue",
                    ]
                )
            )


# --- jobs ---------------------------------------------------------------------------------


def make_job(
    owner: Any = None,
    job_type: str = "sim",
    params: dict[str, Any] | None = None,
    key: str | None = None,
    staff: bool = False,
) -> Job:
    """A new `pending` job made by job_create (its `created` audit entry and event too);
    `staff`: made with staff powers (staff-only params).

    In a transactional test the job is published on commit like any other, and the
    publisher moves it to `queued` once the broker confirms.
    """
    job, _ = job_create(
        owner=owner or UserFactory(),
        job_type=job_type,
        params=params if params is not None else {"steps": 2, "step_seconds": 0},
        idempotency_key=key,
        staff=staff,
    )
    return job


PUBLISHER = Actor.system("publisher")


def job_in_state(
    status: str,
    *,
    owner: Any = None,
    job_type: str = "sim",
    params: dict[str, Any] | None = None,
    key: str | None = None,
    worker: str = "w1",
    result: dict[str, Any] | None = None,
    error_code: str | None = None,
    error_message: str | None = None,
    reason: str = "fatal",
    retry_in: float = 0,
) -> Job:
    """A job brought to `status` through the services, along the path a real job takes.

    Each state adds one step to the one before it (attempt 1 throughout):

    - scheduled: job_create with a run_at an hour ahead (no step before it)
    - pending:   job_create
    - queued:    + the publisher's step (see below)
    - running:   + job_claim by `worker`
    - succeeded: + job_succeed with `result`
    - retrying:  + job_retry: `error_code`, `error_message`, due in `retry_in` seconds
    - failed:    + job_fail_with_dead_letter: `reason`, `error_code`, `error_message`;
                 an open dead letter without a broker copy
    - cancelled: + job_cancel before the job started

    Returns the job as stored. `fence_of(job)` is the running worker's fence.
    """
    if status not in Status.values:
        raise ValueError(f"no job state {status!r}; one of {', '.join(Status.values)}")
    if status == Status.SCHEDULED:  # job_create with a run_at an hour ahead
        scheduled, _ = job_create(
            owner=owner or UserFactory(),
            job_type=job_type,
            params=params if params is not None else {"steps": 2, "step_seconds": 0},
            idempotency_key=key,
            run_at=timezone.now() + timedelta(hours=1),
        )
        return _stored(scheduled)
    job = make_job(owner, job_type, params, key)
    if status == Status.PENDING:
        return _stored(job)
    # No public service reaches `queued` without a broker: job_publish moves the job on
    # the broker's confirm, and a message published here would outlive the test's
    # transaction in the shared vhost. So this is the one direct transition the tests
    # make (in a transactional test the publisher may have done it already, on commit).
    if _stored(job).status == Status.PENDING:
        change("jobs_mark_queued", job_ids=[job.id], actor=PUBLISHER, source=Status.PENDING)
    if status == Status.QUEUED:
        return _stored(job)
    if status == Status.CANCELLED:
        return job_cancel(job_id=job.id, actor=Actor.system("test"))
    claimed = job_claim(job_id=job.id, locked_by=worker)
    assert claimed is not None, f"job {job.id} could not be claimed"
    fence = fence_of(claimed)
    if status == Status.RUNNING:
        return claimed
    if status == Status.SUCCEEDED:
        return job_succeed(job_id=job.id, fence=fence, result=result)
    if status == Status.RETRYING:
        return job_retry(
            job_id=job.id,
            fence=fence,
            delay=retry_in,
            error_code=error_code or "PLANNED",
            error_message=error_message or "planned failure",
        )
    if status == Status.FAILED:
        failed, _ = job_fail_with_dead_letter(
            job_id=job.id,
            reason=reason,
            actor=WORKER,
            error_code=error_code,
            error_message=error_message,
            fence=fence,
        )
        return failed
    raise AssertionError(f"job_in_state does not build {status!r} yet")


def fence_of(job: Job) -> Fence:
    """The fence of the worker that holds `job` (a running job as stored)."""
    assert job.locked_by is not None, f"job {job.id} is {job.status}, held by no worker"
    return Fence(job.locked_by, job.attempts)


def backdate(job: Job, **seconds_ago: float) -> None:
    """As if time had passed: set each named timestamp column to now() minus that many
    seconds (negative: in the future), behind the services' back, e.g.
    `backdate(job, locked_at=600)` for a worker that stopped heartbeating 10 minutes ago.

    now() is the database's clock, the one the services compare against."""
    columns = ", ".join(f"{name} = now() - make_interval(secs => %s)" for name in seconds_ago)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE jobs SET {columns} WHERE id = %s", [*seconds_ago.values(), job.id])


def _stored(job: Job) -> Job:
    return Job.objects.get(id=job.id)


# --- clients ------------------------------------------------------------------------------


def client_for(user: Any) -> APIClient:
    """An API client authenticated with `user`'s token (`client.user` is the user)."""
    token, _ = Token.objects.get_or_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    client.user = user
    return client


def client_with_grant(user: Any) -> APIClient:
    """A token client for staff `user` whose token holds a live OTP grant (what a script
    gets from POST /api/v1/admin/otp with the code its authenticator shows)."""
    from core.api.otp import key_digest, otp_grant_issue

    client = client_for(user)
    token = Token.objects.get(user=user)
    otp_grant_issue(
        user=user, token_digest=key_digest(token.key), otp_token=totp_code(totp_device(user))
    )
    return client


def otp_login(client: Any, user: Any) -> Any:
    """Log `user` into the Django test `client` with a session that passed OTP
    (`client.user` is the user)."""
    from django_otp import DEVICE_ID_SESSION_KEY

    device = totp_device(user)
    client.force_login(user)
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = device.persistent_id
    session.save()
    client.user = user
    return client


# --- portal users (issue 9) -----------------------------------------------------------------


def role_user(role: str, **fields: Any) -> Any:
    """Staff in the `viewer` or `operator` group, as dlq migrations 0006 and 0007 made them.

    Transactional tests empty auth_group between tests, so the group is made again from
    the migration's own table when missing.
    """
    import importlib

    from django.contrib.auth.models import Group, Permission

    roles = importlib.import_module("dlq.migrations.0006_roles").ROLES
    # What later migrations granted the roles (queue controls and schedules; breakers).
    grants: dict[str, list[str]] = {}
    for later in ("0008_queue_schedule_roles", "0009_connector_roles"):
        for name, codenames in importlib.import_module(f"dlq.migrations.{later}").GRANTS.items():
            grants.setdefault(name, []).extend(codenames)
    group, created = Group.objects.get_or_create(name=role)
    if created:
        group.permissions.set(
            [
                Permission.objects.get(content_type__app_label=app, codename=codename)
                for app, codename in roles[role]
            ]
            + list(Permission.objects.filter(codename__in=grants.get(role, [])))
        )
    user = StaffFactory(**fields)
    user.groups.add(group)
    return user


def totp_device(user: Any) -> Any:
    """A confirmed TOTP device for `user` (what `manage.py otp_enroll` makes)."""
    from django_otp.plugins.otp_totp.models import TOTPDevice

    return TOTPDevice.objects.create(user=user, name="phone", confirmed=True)


def totp_code(device: Any) -> str:
    """The code the user's authenticator app shows now."""
    from django_otp.oath import TOTP

    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return f"{totp.token():0{device.digits}d}"


def job_failed(code: str | None = None, reason: str = "exhausted", job_type: str = "sim") -> Job:
    """A job a worker failed with an open dead letter (`code`, `reason`), no broker copy."""
    params = {"event": "order.created"} if job_type == "erp" else None
    return job_in_state(
        "failed",
        job_type=job_type,
        params=params,
        reason=reason,
        error_code=code,
        error_message=f"{code} happened" if code else None,
    )


def worker_lost(job_type: str = "sim") -> Job:
    """A dead letter without a broker copy: the reaper's `worker_lost`."""
    return job_in_state("failed", job_type=job_type, reason="worker_lost")


def dead_letter_without_job(queue: str = "sim", body: str = "not a celery message") -> Any:
    """What the dead-letter watcher records for an undecodable message of `queue`: an
    open row in `<queue>_dlq` that names no job (the broker part is left out)."""
    import uuid

    from dlq.broker import DecodedMessage
    from dlq.services.reconcile import dead_letter_reconcile
    from jobs.models import DeadLetter

    message = DecodedMessage(
        message_id=f"digest:{uuid.uuid4().hex}",
        queue=queue,
        reason="rejected",
        body_text=body,
        decode_error="the body is not a Celery message",
    )
    dead_letter_reconcile(message=message)
    return DeadLetter.objects.get(message_id=message.message_id)
