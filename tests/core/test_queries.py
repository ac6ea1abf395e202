"""The queries.sql loader (core/queries.py): named literal statements, loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.queries import QueryFileError, parse

SOURCE = Path("queries.sql")


def test_statements_are_found_by_name_with_their_description_and_without_the_semicolon():
    queries = parse(
        "-- the file's own comment\n\n"
        "-- name: claim_job\n-- Claims one job.\n-- Skips locked rows.\n"
        "UPDATE jobs\n   SET status = 'running';\n\n"
        "-- name: count_jobs\nSELECT count(*) FROM jobs\n",
        SOURCE,
    )
    assert list(queries) == ["claim_job", "count_jobs"]
    assert queries["claim_job"] == "UPDATE jobs\n   SET status = 'running'"
    assert queries.query("claim_job").description == "Claims one job. Skips locked rows."
    assert queries["count_jobs"] == "SELECT count(*) FROM jobs"


def test_an_unknown_name_is_a_key_error_naming_the_file():
    queries = parse("-- name: a\nSELECT 1;\n", SOURCE)
    with pytest.raises(KeyError, match=r"queries\.sql has no statement named 'b'"):
        queries["b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n", "'a' is defined twice"),
        ("-- name: a\n-- only a description\n", "'a' is empty"),
        ("-- name: Bad-Name\nSELECT 1;\n", "malformed name line"),
        ("SELECT 1;\n-- name: a\nSELECT 2;\n", "SQL before the first"),
    ],
)
def test_a_malformed_file_fails_its_load(text, message):
    with pytest.raises(QueryFileError, match=message):
        parse(text, SOURCE)
