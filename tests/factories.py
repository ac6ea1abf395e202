from __future__ import annotations

import factory
from django.contrib.auth import get_user_model


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")
    password = factory.django.Password("pw-for-tests")


class StaffFactory(UserFactory):
    username = factory.Sequence(lambda n: f"staff{n}")
    is_staff = True


def make_job(owner=None, job_type: str = "sim", params: dict | None = None, key: str | None = None):
    """Create a job through the real service (so it has its `created` audit entry)."""
    from jobs.services import job_create

    job, _ = job_create(
        owner=owner or UserFactory(),
        job_type=job_type,
        params=params if params is not None else {"steps": 2, "step_seconds": 0},
        idempotency_key=key,
    )
    return job


class OperatorFactory(StaffFactory):
    """Staff with the operator's permissions: cancel any job, replay and discard."""

    username = factory.Sequence(lambda n: f"operator{n}")

    @factory.post_generation
    def operator_permissions(self, create: bool, extracted: object, **kwargs: object) -> None:
        from django.contrib.auth.models import Permission

        if create:
            self.user_permissions.add(
                *Permission.objects.filter(
                    codename__in=["cancel_job", "replay_deadletter", "discard_deadletter"]
                )
            )


def role_user(role: str, **fields):
    """Staff in the `viewer` or `operator` group, as dlq migration 0006 made them.

    Transactional tests empty auth_group between tests, so the group is made again from
    the migration's own table when missing.
    """
    import importlib

    from django.contrib.auth.models import Group, Permission

    roles = importlib.import_module("dlq.migrations.0006_roles").ROLES
    group, created = Group.objects.get_or_create(name=role)
    if created:
        group.permissions.set(
            [
                Permission.objects.get(content_type__app_label=app, codename=codename)
                for app, codename in roles[role]
            ]
        )
    user = StaffFactory(**fields)
    user.groups.add(group)
    return user


def totp_device(user):
    from django_otp.plugins.otp_totp.models import TOTPDevice

    return TOTPDevice.objects.create(user=user, name="phone", confirmed=True)


def totp_code(device) -> str:
    """The code the user's authenticator app shows now."""
    from django_otp.oath import TOTP

    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return f"{totp.token():0{device.digits}d}"


def otp_login(client, user):
    """Log `client` in as `user` with an OTP-verified session (as the admin login does)."""
    from django_otp import DEVICE_ID_SESSION_KEY

    device = totp_device(user)
    client.force_login(user)
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = device.persistent_id
    session.save()
    client.user = user
    return client
