"""manage.py job_status ID [--follow [--interval S] [--timeout S]] [--json]"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from jobs.domain.exceptions import JobNotFoundError
from jobs.domain.states import TERMINAL, Status
from jobs.models import Job
from jobs.selectors import job_get
from jobs.selectors.representation import job_representation

TIMED_OUT = 3  # exit status of --follow when --timeout passed before the job ended
# The bar shows a rate once the progress followed has moved over at least this long: over
# a shorter time base a coalesced progress write (one every few seconds) reads as an
# absurd rate. Not tqdm's own rate: it divides the whole percentage, progress made before
# the follow started included, by the seconds since the bar was drawn ("4883778%/s" for a
# job found at 100 %), and its time left is derived from that.
RATE_MIN_SECONDS = 2.0
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt}% [{elapsed}{postfix}]"


def progress_rate(first: tuple[float, int], last: tuple[float, int]) -> float | None:
    """Percentage points per second between two samples (monotonic seconds, percent) of
    one attempt's progress; None while it is undefined: less than RATE_MIN_SECONDS apart,
    or no progress between them."""
    seconds, points = last[0] - first[0], last[1] - first[1]
    if seconds < RATE_MIN_SECONDS or points <= 0:
        return None
    return points / seconds


class Command(BaseCommand):
    help = (
        "Show a job. With --follow, a live progress bar until the job ends: exit 0 when it "
        "succeeded, 1 when it failed or was cancelled, 3 when it had not ended within "
        "--timeout seconds. Exit 2 for an unknown job."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_id")
        parser.add_argument("--follow", action="store_true", help="watch until the job ends")
        parser.add_argument("--interval", type=float, default=0.5, help="poll seconds (follow)")
        parser.add_argument(
            "--timeout",
            type=float,
            default=None,
            help="give up following after this many seconds, exit 3 (default: no limit)",
        )
        parser.add_argument("--json", action="store_true", help="print the API's job body")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            job_id = uuid.UUID(options["job_id"])
            job = job_get(job_id=job_id)
        except (ValueError, JobNotFoundError) as exc:
            raise CommandError(f"No job {options['job_id']!r}.", returncode=2) from exc
        if options["follow"]:
            job = self._follow(job, interval=options["interval"], timeout=options["timeout"])
        if options["json"]:
            self.stdout.write(json.dumps(job_representation(job), indent=2))
        else:
            self._describe(job)
        if not options["follow"]:
            return
        if job.status not in TERMINAL:
            raise CommandError(
                f"job {job.id} still {job.status} after {options['timeout']:g}s (--timeout); "
                "stopped following, the job itself goes on",
                returncode=TIMED_OUT,
            )
        if job.status != Status.SUCCEEDED:
            raise CommandError(f"job {job.id} ended {job.status}", returncode=1)

    def _follow(self, job: Job, *, interval: float, timeout: float | None) -> Job:
        """Redraw the bar from the job row until it reaches a terminal state, or until
        `timeout` seconds have passed (then the job as last read, not yet ended)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        first: tuple[float, int] | None = None  # the attempt's first sample seen
        seen_attempt = None
        # tqdm redraws with \r: give it the raw stream, not Django's line-ending wrapper.
        with tqdm(
            total=100,
            desc=f"{job.type} {str(job.id)[:8]}",
            file=self.stderr._out,
            bar_format=BAR_FORMAT,
        ) as bar:
            while True:
                bar.n = job.progress_percent
                # The bar is the attempt's: it starts again from 0 when a retry runs.
                attempt = _attempt_of(job, short=True)
                sample = (time.monotonic(), job.progress_percent)
                if first is None or job.progress_attempt != seen_attempt:
                    first, seen_attempt = sample, job.progress_attempt
                rate = progress_rate(first, sample) if job.status == Status.RUNNING else None
                shown = [job.status, attempt, job.progress_step or ""]
                if rate is not None:
                    shown.append(f"{rate:.1f}%/s")
                bar.set_postfix_str(" ".join(s for s in shown if s), refresh=False)
                bar.refresh()
                if job.status in TERMINAL:
                    return job
                if deadline is not None and time.monotonic() >= deadline:
                    return job
                time.sleep(interval)
                job = job_get(job_id=job.id)

    def _describe(self, job: Job) -> None:
        lines = [
            f"id:        {job.id}",
            f"type:      {job.type} (queue {job.queue})",
            f"status:    {job.status}" + (" (cancel requested)" if job.cancel_requested else ""),
            f"progress:  {job.progress_percent}%"
            + "".join(f" {s}" for s in (job.progress_step, job.progress_message) if s)
            + (f" ({_attempt_of(job)})" if job.progress_attempt else ""),
            f"attempts:  {job.attempts}/{job.max_attempts}",
            f"created:   {job.created_at.isoformat()}",
            f"updated:   {job.updated_at.isoformat()}",
        ]
        if job.last_error_code or job.last_error_message:
            lines.append(f"error:     {job.last_error_code}: {job.last_error_message}")
        if job.dead_letter_queue:
            lines.append(f"dead letter queue: {job.dead_letter_queue}")
        if job.result is not None:
            lines.append(f"result:    {json.dumps(job.result)}")
        lines += [f"artefact:  {a.kind}/{a.name} ({a.size} bytes)" for a in job.artefacts.all()]
        self.stdout.write("\n".join(lines))


def _attempt_of(job: Job, *, short: bool = False) -> str:
    """Which attempt the progress belongs to: `attempt 2 of 6` (short: `attempt 2/6`)."""
    if not job.progress_attempt:
        return ""
    joined = "/" if short else " of "
    return f"attempt {job.progress_attempt}{joined}{job.max_attempts}"
