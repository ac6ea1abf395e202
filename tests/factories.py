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
