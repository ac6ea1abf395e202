"""Read access to the job types table in settings (docs/architecture.md#job-types-and-handlers)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


@dataclass(frozen=True)
class JobType:
    name: str
    category: str
    # How long an idempotency key returns its job, and how long a job is kept once it
    # ended: its category's (JOBOPS_KEY_TTL, JOBOPS_RETENTION) unless the type sets one.
    key_ttl: timedelta
    retention: timedelta
    queue: str
    # Its category's (JOBOPS_CATEGORY_RETRIES) unless the type sets its own.
    max_retries: int
    backoff_cap: int
    soft_time_limit: int
    time_limit: int
    params_serializer: str
    handler: str
    # The external system its handler calls (docs/connectors.md), None for none; and
    # while that connector's breaker is open, whether a create waits ("wait": accepted,
    # the job waits for the probe) or is refused ("refuse": 409 ERR-CONNECTOR-OPEN).
    connector: str | None = None
    connector_open: str = "wait"

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1

    @property
    def work_budget(self) -> float:
        """Seconds of planned work a job of this type may have: JOBOPS_WORK_BUDGET_FRACTION
        of its soft time limit (the params schemas that estimate their work check it)."""
        return self.soft_time_limit * settings.JOBOPS_WORK_BUDGET_FRACTION

    @property
    def task_name(self) -> str:
        return f"jobs.{self.name}"

    def load_params_serializer(self) -> Any:
        return import_string(self.params_serializer)

    def load_handler(self) -> Any:
        return import_string(self.handler)


# (the settings they were built from, the types): rebuilt when one of those settings is
# another object (override_settings), not on every lookup (the publisher asks once per job).
_built: tuple[tuple[Any, ...], dict[str, JobType]] | None = None


def all_types() -> dict[str, JobType]:
    global _built
    table = settings.JOB_TYPES
    sources = (
        table,
        settings.JOBOPS_KEY_TTL,
        settings.JOBOPS_RETENTION,
        settings.JOBOPS_CATEGORY_RETRIES,
    )
    if _built is None or any(a is not b for a, b in zip(_built[0], sources, strict=True)):
        _built = (sources, {name: _build(name, spec) for name, spec in table.items()})
    return dict(_built[1])


def _build(name: str, spec: dict[str, Any]) -> JobType:
    category = spec["category"]
    return JobType(
        name=name,
        **{
            "key_ttl": settings.JOBOPS_KEY_TTL[category],
            "retention": settings.JOBOPS_RETENTION[category],
            **settings.JOBOPS_CATEGORY_RETRIES[category],
            **spec,
        },
    )


def get_type(name: str) -> JobType | None:
    return all_types().get(name)


def primary_queue_names() -> list[str]:
    """The primary queues, in table order, without repeats."""
    return list(dict.fromkeys(t.queue for t in all_types().values()))


# A queue's executor (settings.JOBOPS_QUEUE_EXECUTORS, docs/postgres-executor.md).
CELERY, POSTGRES = "celery", "postgres"


def queue_executor(queue: str) -> str | None:
    """`celery` or `postgres` for a queue of the types table; None for any other name."""
    return settings.JOBOPS_QUEUE_EXECUTORS.get(queue)


def postgres_queues() -> list[str]:
    """The queues `manage.py run_worker` runs (JOBOPS_EXECUTOR_<QUEUE>=postgres), in table
    order: the dispatcher publishes none of their jobs to the broker."""
    return [q for q in primary_queue_names() if queue_executor(q) == POSTGRES]


@dataclass(frozen=True)
class ConnectorSpec:
    """One breaker: a connector's breaker settings (JOBOPS_CONNECTORS, docs/connectors.md)
    and the job types that call it. A connector without providers is one breaker of its
    own name; a connector with providers has one per provider, named
    `connector:provider`, each with the connector's settings and the provider's weight
    (`fallback`: the provider that takes the calls while every primary one is open) and
    address (`url`, None: the handler's own)."""

    name: str
    failures: int
    cooldown_seconds: float
    probe_wait_seconds: float
    jitter_seconds: float
    types: tuple[str, ...]
    # The connector (the types' `connector`) and, for a provider's breaker, its name.
    connector: str = ""
    provider: str | None = None
    weight: int = 1
    fallback: bool = False
    url: str | None = None

    @property
    def probe_lease_seconds(self) -> float:
        """How long a probe may hold the half-open breaker before another job may probe:
        its types' longest hard time limit plus the lock timeout (a probe that outlives
        that has died, and the reaper has already reclaimed it)."""
        longest = max((all_types()[t].time_limit for t in self.types), default=0)
        return float(longest + settings.JOBOPS_LOCK_TIMEOUT)


def _connectors() -> tuple[dict[str, ConnectorSpec], dict[str, tuple[ConnectorSpec, ...]]]:
    """The breakers by name and by connector, from the settings as they are now."""
    types = all_types()
    named = {t.connector for t in types.values() if t.connector} | set(settings.JOBOPS_CONNECTORS)
    by_name: dict[str, ConnectorSpec] = {}
    by_connector: dict[str, tuple[ConnectorSpec, ...]] = {}
    for connector in sorted(named):
        fields = settings.JOBOPS_CONNECTORS.get(connector, settings.JOBOPS_CONNECTOR_DEFAULTS)
        base = ConnectorSpec(
            name=connector,
            failures=int(fields["failures"]),
            cooldown_seconds=float(fields["cooldown_seconds"]),
            probe_wait_seconds=float(fields["probe_wait_seconds"]),
            jitter_seconds=float(fields["jitter_seconds"]),
            types=tuple(t.name for t in types.values() if t.connector == connector),
            connector=connector,
        )
        providers = fields.get("providers")
        if not providers:
            by_connector[connector] = (base,)
        else:
            by_connector[connector] = tuple(
                replace(
                    base,
                    name=f"{connector}:{p['name']}",
                    provider=p["name"],
                    weight=int(p["weight"]),
                    fallback=bool(p["fallback"]),
                    url=p.get("url"),
                )
                for p in providers
            )
        by_name.update((spec.name, spec) for spec in by_connector[connector])
    return dict(sorted(by_name.items())), by_connector


def all_connectors() -> dict[str, ConnectorSpec]:
    """Every breaker, in name order: each connector a job type names, with its settings
    (its entry of JOBOPS_CONNECTORS, else JOBOPS_CONNECTOR_DEFAULTS), or, for a
    connector with providers, each of its providers (`connector:provider`)."""
    return _connectors()[0]


def connectors_grouped() -> dict[str, tuple[ConnectorSpec, ...]]:
    """Each connector's breakers (`connector_providers`), by connector."""
    return _connectors()[1]


def connector_providers(connector: str) -> tuple[ConnectorSpec, ...]:
    """A connector's breakers in their configured order: itself alone, or its providers
    (the fallback among them); () for no such connector."""
    return _connectors()[1].get(connector, ())


def get_connector(name: str) -> ConnectorSpec | None:
    return all_connectors().get(name)
