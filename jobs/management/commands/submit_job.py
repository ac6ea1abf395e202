"""manage.py submit_job --type T --params JSON [--key K] [--owner USERNAME] [--org SLUG]
[--project SLUG], or submit_job --file jobs.jsonl [--key K] [--owner USERNAME]: a file of
jobs, one JSON object per line (docs/operations/index.md#commands)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ApplicationError
from core.json import json_loads
from jobs.domain.exceptions import BadRequestError, PayloadTooLargeError
from jobs.services import job_create
from jobs.services.batch_creation import (
    BatchItem,
    BatchOutcome,
    batch_item_key,
    batch_items_read,
    job_batch_submit,
)
from tenants.selectors import placement_for


class Command(BaseCommand):
    help = (
        "Submit a job as a user (default: the first administrator), exactly as the API would. "
        "Prints the job id and status. Exit 2 on any error."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--type", dest="job_type", help="e.g. sim, report")
        source.add_argument(
            "--file",
            help="a file of jobs, one JSON object per line (type, params, idempotency_key, "
            "run_at, priority, org, project), submitted in batches; - reads stdin",
        )
        parser.add_argument("--params", default="{}", help="JSON object, e.g. '{\"steps\": 5}'")
        parser.add_argument(
            "--key",
            default=None,
            help="idempotency key (repeat: same job); with --file, each job without its own "
            "gets <key>:<line>",
        )
        parser.add_argument("--owner", default=None, help="username (default: first superuser)")
        parser.add_argument(
            "--org", default=None, help="organisation slug (needed if the owner is in several)"
        )
        parser.add_argument("--project", default=None, help="project slug in that organisation")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["file"] is not None:
            self._submit_file(options)
            return
        try:
            params = json_loads(options["params"])
        except ValueError as exc:  # not JSON, or a number too long to read
            raise CommandError(f"--params is not valid JSON: {exc}", returncode=2) from exc
        owner = _owner(options["owner"])
        try:
            placement = placement_for(owner, org=options["org"], project=options["project"])
            job, created = job_create(
                owner=owner,
                placement=placement,
                job_type=options["job_type"],
                params=params,
                idempotency_key=options["key"],
                # A shell on the host already holds every power: no second factor here.
                staff=bool(owner.is_staff),
            )
        except ApplicationError as exc:
            details = f" {json.dumps(exc.details)}" if exc.details else ""
            raise CommandError(f"{exc.code}: {exc.message}{details}", returncode=2) from exc
        verb = "created" if created else "exists"
        self.stdout.write(f"{job.id} {job.status} ({verb}, type {job.type}, owner {owner})")

    def _submit_file(self, options: dict[str, Any]) -> None:
        """Each line of the file a job of a batch create (blank lines skipped), read as
        the API reads a batch's jobs, submitted JOBOPS_BATCH_CREATE_MAX at a time; one
        line printed per job, in order. A bad line is reported with its number and the
        others are submitted; exit 2 when any failed."""
        owner = _owner(options["owner"])
        lines = _read_lines(options["file"])
        failed = 0
        size = settings.JOBOPS_BATCH_CREATE_MAX
        for start in range(0, len(lines), size):
            chunk = lines[start : start + size]
            items = _line_items(chunk, options["key"])
            outcomes, _ = job_batch_submit(
                owner=owner,
                items=items,
                # A shell on the host holds every power: no second factor, no rate limit.
                staff=bool(owner.is_staff),
                limits=False,
            )
            for (number, _), outcome in zip(chunk, outcomes, strict=True):
                failed += outcome.error is not None
                self.stdout.write(_outcome_line(number, outcome))
        self.stdout.write(f"{len(lines) - failed} of {len(lines)} jobs submitted (owner {owner})")
        if failed:
            raise CommandError(f"{failed} line(s) failed.", returncode=2)


# The most lines and bytes a file of jobs may hold: a mistake (the wrong file) is refused
# before anything is read into memory or submitted.
MAX_FILE_LINES = 100_000
MAX_FILE_BYTES = 64 * 1024 * 1024


def _read_lines(name: str) -> list[tuple[int, str]]:
    """The file's non-blank lines with their numbers (from 1); CommandError (exit 2)
    for a file that cannot be read, is not UTF-8, or is over the bounds."""
    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        else:
            with Path(name).open("rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"--file {name}: {exc}", returncode=2) from exc
    if len(data) > MAX_FILE_BYTES:
        raise CommandError(f"--file {name}: over {MAX_FILE_BYTES} bytes; split it.", returncode=2)
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if len(lines) > MAX_FILE_LINES:
        raise CommandError(
            f"--file {name}: {len(lines)} jobs, at most {MAX_FILE_LINES}; split it.", returncode=2
        )
    return lines


def _line_items(
    chunk: list[tuple[int, str]], key: str | None
) -> list[BatchItem | ApplicationError]:
    """Each line as a job of the batch: the API's reading of a job, its key the line's
    own or `<key>:<line>`; a line over JOBOPS_MAX_PAYLOAD_BYTES or not JSON, its error."""
    limit = settings.JOBOPS_MAX_PAYLOAD_BYTES
    parsed: list[Any] = []
    for _, text in chunk:
        if len(text.encode("utf-8")) > limit:
            parsed.append(
                PayloadTooLargeError(f"The line is over {limit} bytes (JOBOPS_MAX_PAYLOAD_BYTES).")
            )
            continue
        try:
            parsed.append(json_loads(text))
        except ValueError as exc:
            parsed.append(BadRequestError(f"Malformed JSON: {exc}"))
    readable = [raw for raw in parsed if not isinstance(raw, ApplicationError)]
    read = iter(batch_items_read(readable))
    items: list[BatchItem | ApplicationError] = []
    for (number, _), raw in zip(chunk, parsed, strict=True):
        item = raw if isinstance(raw, ApplicationError) else next(read)
        if isinstance(item, BatchItem) and item.idempotency_key is None and key is not None:
            item = dataclasses.replace(item, idempotency_key=batch_item_key(None, key, number))
        items.append(item)
    return items


def _outcome_line(number: int, outcome: BatchOutcome) -> str:
    if outcome.error is None:
        return f"{number} {outcome.job_id} {outcome.status}"
    error = outcome.error
    details = f" {json.dumps(error.details)}" if error.details else ""
    return f"{number} error {error.code}: {error.message}{details}"


def _owner(username: str | None) -> Any:
    users = get_user_model().objects
    if username:
        owner = users.filter(username=username).first()
        if owner is None:
            raise CommandError(f"No user {username!r}.", returncode=2)
        return owner
    owner = users.filter(is_superuser=True, is_active=True).order_by("pk").first()
    if owner is None:
        raise CommandError("No administrator exists; pass --owner USERNAME.", returncode=2)
    return owner
