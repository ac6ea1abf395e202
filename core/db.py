"""Running the hot, hand-written statements (jobs/queries.sql) with server-side binding.

Django's psycopg backend binds parameters on the client: each execute renders the whole
statement as text, escaping every value in Python, and PostgreSQL parses and plans it
anew. For the few statements every job runs (create, claim, finish) that cost more than
the work itself. Here the parameters travel separately and the statement is prepared on
first use per connection (psycopg keeps the prepared statements of its connection), so
later executions send only the values.

Behind a connection pooler in transaction mode, prepared statements need its protocol
support (PgBouncer 1.21+ with max_prepared_statements set).

`model_from_row` turns such a statement's rows back into model instances (by column
name: a statement may read `jobs.*`, in the table's order), converted exactly as the ORM
converts its own reads. `read_within` bounds a read that no index serves by a statement
timeout.

Errors come out as Django's database exceptions (IntegrityError, OperationalError...),
exactly as from `connection.cursor()`, and the statement joins the caller's transaction
(it runs on Django's own connection).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import psycopg
from django.db import OperationalError, connection, connections, transaction
from django.db.models import Field, Model
from django_prometheus.db import metrics as db_metrics
from django_prometheus.db.common import DatabaseWrapperMixin
from psycopg._queries import PostgresQuery, _query2pg_nocache

from core.queries import QUERIES

M = TypeVar("M", bound=Model)
T = TypeVar("T")

NEVER_BY_COUNT = 2**31


class Rows(list[tuple[Any, ...]]):
    """A statement's rows, with the names of their columns in order."""

    def __init__(self, rows: list[tuple[Any, ...]], columns: tuple[str, ...]) -> None:
        super().__init__(rows)
        self.columns = columns


def execute_prepared(statement: str, params: dict[str, Any]) -> Rows:
    """Execute `statement` with server-side binding, prepared; returns its rows.

    Like Django's own cursors it runs through the connection's execute wrappers
    (`connection.execute_wrapper`) and is logged where queries are logged (DEBUG,
    assertNumQueries), so a test or a tool that counts statements sees these too.
    """
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        # Django opens its connections with preparing off (its own cursors bind on the
        # client and never prepare); `prepare=True` below prepares only these
        # statements, and no other statement is prepared by count.
        raw.prepare_threshold = NEVER_BY_COUNT
    exported = _exported(connection.alias)
    with connection.wrap_database_errors, _NamedStatementCursor(raw) as cursor:

        def run(sql: str, values: Any, many: bool, context: dict[str, Any]) -> Any:
            if exported is None:
                cursor.execute(sql, values, prepare=True)
            else:
                exported.execute_total.inc()
                started = time.perf_counter()
                try:
                    cursor.execute(sql, values, prepare=True)
                except BaseException as exc:
                    exported.error(type(exc))
                    raise
                finally:
                    exported.duration.observe(time.perf_counter() - started)
            # Every statement run here returns rows (RETURNING or SELECT). The names
            # straight from the result: `cursor.description` builds a Column object per
            # column, 40 of them for a job row.
            result = cursor.pgresult
            names = () if result is None else _column_names(result, raw.info.encoding)
            return Rows(cursor.fetchall(), names)

        executor: Callable[..., Any] = run
        for wrapper in reversed(connection.execute_wrappers):
            executor = functools.partial(wrapper, executor)
        started = time.monotonic()
        try:
            rows: Rows = executor(
                statement, params, False, {"connection": connection, "cursor": cursor}
            )
        finally:
            if connection.queries_logged:
                connection.queries_log.append(
                    {"sql": statement, "time": f"{time.monotonic() - started:.3f}"}
                )
        return rows


class _Exported(NamedTuple):
    """One database alias's children of django-prometheus' database metrics."""

    execute_total: Any
    duration: Any
    labels: tuple[str, str]

    def error(self, kind: type[BaseException]) -> None:
        db_metrics.errors_total.labels(*self.labels, kind.__name__).inc()


_exported_by_alias: dict[str, _Exported | None] = {}


def _exported(alias: str) -> _Exported | None:
    """The metric children to count a statement as django-prometheus' database backend
    counts those of Django's cursors (django_db_execute_total,
    django_db_query_duration_seconds, django_db_errors_total): these run on a psycopg
    cursor of their own, which its cursor factory never sees. None when another backend
    is configured. Looked up once per alias: `labels()` takes a lock and checks its
    arguments each time, and this runs for every claim and every end of a job."""
    try:
        return _exported_by_alias[alias]
    except KeyError:
        pass
    wrapper = connections[alias]
    found = None
    if isinstance(wrapper, DatabaseWrapperMixin):
        labels = (wrapper.alias, wrapper.vendor)
        found = _Exported(
            db_metrics.execute_total.labels(*labels),
            db_metrics.query_duration_seconds.labels(*labels),
            labels,
        )
    _exported_by_alias[alias] = found
    return found


def _column_names(result: Any, encoding: str) -> tuple[str, ...]:
    return tuple((result.fname(n) or b"").decode(encoding) for n in range(result.nfields))


@functools.lru_cache(maxsize=128)
def _converted(query: str, encoding: str) -> Any:
    return _query2pg_nocache(query.encode(encoding), encoding)


class _NamedStatementQuery(PostgresQuery):
    """psycopg's conversion of `%(name)s` placeholders to `$n`, kept per statement.

    psycopg keeps it only for statements under 4 KB (MAX_CACHED_STATEMENT_LENGTH), so
    that an ORM's endless generated texts cannot fill its cache; the old one-for-all
    transition statement was 7 KB with 76 placeholders, and splitting it again took
    ~0.15 ms of CPU at every claim, end and publish batch. The statements run here are
    the named ones of queries.sql, a fixed set, so keeping each is bounded. (psycopg's
    own parts, pinned in constraints.txt: tests/core/test_db.py checks the behaviour.)"""

    def convert(self, query: Any, vars: Any) -> None:
        if vars is None or not isinstance(query, str):
            super().convert(query, vars)
            return
        self.query, self._want_formats, self._order, self._parts = _converted(query, self._encoding)
        self.dump(vars)


class _NamedStatementCursor(psycopg.Cursor[Any]):
    _query_cls = _NamedStatementQuery


def read_within(seconds: float, read: Callable[[], T]) -> T | None:
    """`read()` (queries only) under a statement timeout of `seconds` each; None when
    PostgreSQL cancelled it for taking longer.

    For reads no index can serve, whose cost grows with a table (the portal's search
    by the end of an id): they answer within the time or not at all. The timeout is set
    for this transaction only and set back afterwards, so an enclosing transaction (a
    test's, ATOMIC_REQUESTS) keeps its own; the cancelled statement is undone alone (a
    savepoint), so the enclosing transaction goes on.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        timeout = f"{max(1, int(seconds * 1000))}ms"
        cursor.execute(QUERIES["statement_timeout_set"], {"timeout": timeout})
        (before, _) = cursor.fetchone()
        try:
            with transaction.atomic():
                return read()
        except OperationalError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.QueryCanceled):
                raise
            return None
        finally:
            cursor.execute(QUERIES["statement_timeout_set"], {"timeout": before})


@functools.cache
def select_columns(model: type[Model], alias: str) -> str:
    """`model`'s concrete columns, qualified by `alias`, in the order `model_from_row`
    reads them."""
    return ", ".join(f"{alias}.{connection.ops.quote_name(f.column)}" for f in _fields(model))


def model_from_row(
    model: type[M], values: Sequence[Any], columns: Sequence[str] | None = None
) -> M:
    """An instance of `model` from a row, converted as the ORM's own reads convert them
    (e.g. JSON text to Python values): the values of `select_columns(model, ...)`, or,
    given the row's `columns` (Rows.columns), the model's columns found by name (other
    columns of the row are left out)."""
    fields = _fields(model)
    if columns is None:
        converted = list(values[: len(fields)])
    else:
        converted = [values[n] for n in _positions(model, tuple(columns))]
    for index, convert in _converters(model):
        converted[index] = convert(converted[index])
    return model.from_db(connection.alias, [f.attname for f in fields], converted)


@functools.cache
def _positions(model: type[Model], columns: tuple[str, ...]) -> tuple[int, ...]:
    """Where each of `model`'s concrete columns stands among `columns`."""
    index = {name: n for n, name in reversed(list(enumerate(columns)))}
    return tuple(index[field.column] for field in _fields(model))


@functools.cache
def _fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    return tuple(model._meta.concrete_fields)


@functools.cache
def _converters(model: type[Model]) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
    found = []
    for index, field in enumerate(_fields(model)):
        column = field.get_col(model._meta.db_table)
        # The ORM's own two sources of converters (the backend's, the field's).
        steps = connection.ops.get_db_converters(column) + field.get_db_converters(connection)  # type: ignore[attr-defined]
        if steps:
            found.append((index, functools.partial(_apply, steps, column)))
    return tuple(found)


def _apply(steps: list[Callable[..., Any]], column: Any, value: Any) -> Any:
    for step in steps:
        value = step(value, column, connection)
    return value


def resolve_psycopg_dumpers() -> None:
    """Resolve, once and before any thread runs a query, the dumpers psycopg registers
    by class name (uuid.UUID, datetime, Decimal, ipaddress).

    psycopg replaces such a name by the class the first time it adapts one, in a dict
    that every connection's adapters share; two threads doing that at once can fail a
    query with "cannot adapt type 'UUID'" (psycopg/psycopg#1230). gunicorn's threaded
    workers met it under a burst of creates."""
    import datetime as dt
    import decimal
    import ipaddress
    import uuid

    from psycopg import adapters
    from psycopg.adapt import PyFormat

    classes = (
        uuid.UUID,
        dt.date,
        dt.datetime,
        dt.time,
        dt.timedelta,
        decimal.Decimal,
        ipaddress.IPv4Address,
        ipaddress.IPv6Address,
        ipaddress.IPv4Network,
        ipaddress.IPv6Network,
        ipaddress.IPv4Interface,
        ipaddress.IPv6Interface,
    )
    for cls in classes:
        for format in PyFormat:
            adapters.get_dumper(cls, format)
