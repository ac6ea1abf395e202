"""The transition functions (jobs/sql/20_transitions.sql) as PostgreSQL holds them, and
the kinds of change that call them (jobs.services.transitions.KINDS)."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from core import sqlfiles
from jobs.domain.states import ALLOWED
from jobs.services.transitions import COMMON_ARGS, KINDS

pytestmark = pytest.mark.django_db

TRANSITIONS = sqlfiles.ROOT / "jobs" / "sql" / "20_transitions.sql"
FUNCTIONS = [f for f in sqlfiles.functions([TRANSITIONS])]


def _proc(name: str) -> tuple[int, list[str], list[str], str]:
    """(pronargs, argument names, argument types, prosrc) of the one function `name`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.pronargs, p.proargnames, "
            "ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t), p.prosrc "
            "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proname = %s",
            [name],
        )
        rows = cursor.fetchall()
    assert len(rows) == 1, f"{name}: {len(rows)} functions of that name"
    nargs, names, types, source = rows[0]
    return nargs, list(names or [])[:nargs], list(types), source


def test_every_kind_of_change_has_its_function_and_every_function_a_kind():
    assert {f.name for f in FUNCTIONS} == set(KINDS)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_no_transition_function_takes_more_than_12_arguments(name):
    nargs, _, _, _ = _proc(name)
    assert nargs <= 12


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_functions_arguments_are_the_kinds_and_none_switches_behaviour(name):
    kind = KINDS[name]
    _, names, types, source = _proc(name)
    expected = [("ids", "uuid[]"), *kind.args, *COMMON_ARGS]
    assert names == [f"p_{n}" for n, _ in expected]
    aliases = {"int[]": "integer[]", "int": "integer", "float8[]": "double precision[]"}
    aliases |= {"float8": "double precision"}
    assert types == [aliases.get(t, t) for _, t in expected]
    # No flag: no boolean argument, no argument tested for NULL, no jsonb bag of options
    # (a jsonb argument is data: a result, a progress value, params).
    assert "boolean" not in types
    for arg in names:
        assert not re.search(rf"\b{arg}\s+IS\s+(NOT\s+)?NULL", source, re.IGNORECASE), arg
        assert not re.search(rf"coalesce\([^)]*\b{arg}\b", source, re.IGNORECASE), arg
        assert not re.search(rf"\b{arg}\s*(->>|->|\?)", source), arg


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_kind_moves_only_along_the_transition_table(name):
    kind = KINDS[name]
    _, _, _, source = _proc(name)
    if kind.target is not None:
        assert kind.sources <= ALLOWED[kind.target]
        assert f"status = '{kind.target}'" in source
    else:
        assert "status = '" not in source.split("UPDATE jobs SET", 1)[1].split("FROM locked")[0]
    # The event the entry's payload names is the one the function appends.
    if kind.event is not None:
        assert f"'{kind.event}'" in source
    else:
        assert "p_event_type" in source


@pytest.mark.parametrize("name", sorted(KINDS))
def test_rows_are_locked_in_id_order_and_fenced_writes_check_holder_and_attempt(name):
    _, names, _, source = _proc(name)
    # The given ids in order drive the lock, one primary-key probe each (a LATERAL with
    # FOR UPDATE, which the planner cannot turn into a scan of some other index).
    assert "ORDER BY u.id) AS i\n        CROSS JOIN LATERAL (" in source
    assert "WHERE jobs.id = i.id\n" in source
    assert "FOR UPDATE\n        ) AS jobs" in source
    if "p_locked_by" in names and "p_attempts" in names:
        assert "jobs.locked_by = p_locked_by" in source
        assert "jobs.attempts = i.attempt" in source
