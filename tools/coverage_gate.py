"""The coverage gate of `make test`: every module of the orchestration core at 90 % or more.

Reads the data that `pytest --cov` left in `.coverage` (the test process and every
worker, dispatcher and manage.py run the tests started, combined), prints one line per
gated module with the lines no test ran, and exits 1 naming each module under the bar.
A gate per module, not on the total: the rest of the code base would hide a core module
that lost its tests.

    .venv/bin/pytest --cov --cov-report= && .venv/bin/python tools/coverage_gate.py
"""

from __future__ import annotations

import io
import math
import sys
from pathlib import Path

import coverage
from coverage.exceptions import CoverageException

ROOT = Path(__file__).resolve().parent.parent
FAIL_UNDER = 90.0

# The orchestration core: what creates a job, moves it from state to state, publishes
# it, runs it, retries it, reaps it from a dead worker, dead-letters it, and appends and
# verifies the audit trail of every step. A module that is renamed or split must be
# renamed here too: a path that no longer exists fails the gate.
GATED = (
    "jobs/domain/states.py",
    "jobs/queries.py",
    "jobs/services/creation.py",
    "jobs/services/transitions.py",
    "jobs/services/cancellation.py",
    "jobs/services/publishing.py",
    "jobs/integrations/publisher.py",
    "jobs/processes/dispatcher.py",
    "jobs/processes/runtime.py",
    "jobs/execution/context.py",
    "jobs/execution/run.py",
    "jobs/execution/decide.py",
    "jobs/execution/complete.py",
    "jobs/execution/heartbeat.py",
    "jobs/execution/limits.py",
    "jobs/services/worker.py",
    "jobs/services/reaper.py",
    "jobs/services/dead_letters.py",
    "audit/canonical.py",
    "audit/services.py",
    "audit/checkpoints.py",
    "audit/verification.py",
)


def main() -> int:
    data_file = ROOT / ".coverage"
    if not data_file.exists():
        print(f"coverage gate: no {data_file.name} here; run `pytest --cov` first")
        return 2
    missing = [path for path in GATED if not (ROOT / path).is_file()]
    if missing:
        print(f"coverage gate: gated modules that do not exist: {', '.join(missing)}")
        return 1

    cov = coverage.Coverage(data_file=str(data_file), config_file=str(ROOT / "pyproject.toml"))
    cov.load()
    files = [str(ROOT / path) for path in GATED]
    try:
        cov.report(morfs=files, show_missing=True, file=sys.stdout)
        # Each module on its own: report() answers the percentage of what it reports.
        covered = {path: cov.report(morfs=[str(ROOT / path)], file=io.StringIO()) for path in GATED}
    except CoverageException as exc:
        print(f"coverage gate: {exc}")
        return 1

    under = {path: pc for path, pc in covered.items() if pc < FAIL_UNDER}
    for path, pc in under.items():
        # Rounded down: 89.96 % must not read "90.0 %, under 90 %".
        print(f"coverage gate: {path} is at {math.floor(pc * 10) / 10} %, under {FAIL_UNDER:.0f} %")
    if under:
        return 1
    print(f"coverage gate: all {len(GATED)} orchestration modules at {FAIL_UNDER:.0f} % or more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
