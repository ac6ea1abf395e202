"""Run every benchmark in turn, then summarise (what `make bench` does).

    python bench/run.py [--quick] [--only api,e2e] [--skip scale]

Each benchmark runs in its own process with its own scratch places; one that fails
does not stop the others. Exit status 1 when a benchmark failed or a check did.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (name, extra arguments at full size). e2e adds its profile: the figures before and
# after a change come with the statements, round trips and Python time that explain them.
BENCHMARKS: list[tuple[str, list[str]]] = [
    ("audit", []),
    ("audit_proof", []),
    ("audit_incremental", []),
    # A year of audit history simulated at a tenth of the spec's monthly volume (about ten
    # minutes); `python bench/audit_year.py --full` is the spec's scale.
    ("audit_year", []),
    ("api", []),
    ("create_profile", []),
    ("e2e", ["--profile"]),
    ("executors", []),
    ("events", []),
    ("sse", []),
    ("dlq_replay", []),
    ("burst", []),
    ("scale", []),
    ("retention", []),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every benchmark at small size")
    parser.add_argument("--only", default="", help="comma-separated names")
    parser.add_argument("--skip", default="", help="comma-separated names")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n}
    skip = {n for n in args.skip.split(",") if n}
    failed = []
    started = time.monotonic()
    for name, extra in BENCHMARKS:
        if (only and name not in only) or name in skip:
            continue
        argv = [sys.executable, str(HERE / f"{name}.py"), *extra]
        if args.quick:
            argv.append("--quick")
        began = time.monotonic()
        code = subprocess.run(argv).returncode
        print(f"-- {name}: exit {code} after {time.monotonic() - began:.0f} s\n", flush=True)
        if code:
            failed.append(name)
    print(f"== all benchmarks in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    code = subprocess.run([sys.executable, str(HERE / "summary.py")]).returncode
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed or code else 0


if __name__ == "__main__":
    sys.exit(main())
