"""Summarise benchmark results, or compare two runs (before/after).

    python bench/summary.py                       # bench/results/*.json
    python bench/summary.py DIR                   # another run's results
    python bench/summary.py BEFORE_DIR AFTER_DIR  # side by side, with the change

Every `compare`/`target` line of every benchmark becomes one row: the figure, its
baseline from the same run, the ratio and whether the target of issue 10 was met;
every check (0 lost, chains valid, ...) one row ok/FAILED. Comparing two runs puts
each figure of the first beside the second and their ratio, so a change in the app
reads as "x1.8" rather than as two columns of numbers to divide by hand. Exit status
1 when a check failed in the (last) run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ORDER = [
    "audit",
    "audit_proof",
    "audit_year",
    "api",
    "create_profile",
    "e2e",
    "executors",
    "events",
    "dlq_replay",
    "burst",
    "scale",
]


def load(directory: Path) -> dict[str, dict[str, Any]]:
    runs = {}
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "comparisons" in data:
            runs[data["benchmark"]] = data
    return dict(sorted(runs.items(), key=lambda kv: [*ORDER, kv[0]].index(kv[0])))


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "-" if value is None else str(value)


def goal(row: dict[str, Any]) -> str:
    op = ">=" if row.get("target_is") == "min" else "<="
    parts = []
    if row.get("target_ratio") is not None:
        parts.append(f"ratio {op} {fmt(row['target_ratio'])}")
    if row.get("target_value") is not None:
        parts.append(f"{op} {fmt(row['target_value'])}")
    if not parts:
        return ""
    return f"[{', '.join(parts)}: {'met' if row.get('met') else 'MISSED'}]"


def show(runs: dict[str, dict[str, Any]]) -> bool:
    failed = False
    for name, run in runs.items():
        machine = run.get("machine", {})
        print(
            f"{name}  ({run.get('when')}, commit {str(machine.get('git_commit'))[:10]}"
            f"{' +changes' if machine.get('git_dirty_app') else ''}, load "
            f"{machine.get('loadavg_at_start', ['?'])[0]} on {machine.get('cpus')} cpus, "
            f"{'QUICK sizes' if run.get('arguments', {}).get('quick') else 'full sizes'})"
        )
        for row in run["comparisons"].values():
            ratio = "" if row.get("ratio") is None else f"ratio {row['ratio']:.2f}"
            base = f"| {row['baseline_label']} {fmt(row['baseline'])} " if "baseline" in row else ""
            print(
                f"  {row['label']:<40} {fmt(row['value']):>10} {row['unit']:<7}{base}"
                f"{ratio} {goal(row)}"
            )
        figures = run.get("figures", {})
        if figures:
            print("  figures: " + ", ".join(f"{k} {fmt(v)}" for k, v in figures.items()))
        for check in run["checks"].values():
            failed |= not check["ok"]
            print(f"  {check['label']:<40} {'ok' if check['ok'] else 'FAILED'}")
    return failed


def compare(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> bool:
    failed = False
    print(f"{'figure':<52}{'before':>11}{'after':>11}{'change':>9}  target (after)")
    for name in [n for n in after if n in before]:
        print(name)
        rows_before = before[name]["comparisons"]
        for key, row in after[name]["comparisons"].items():
            old = rows_before.get(key, {}).get("value")
            change = f"x{row['value'] / old:.2f}" if old else ""
            print(
                f"  {row['label'] + ' (' + row['unit'] + ')':<50}{fmt(old):>11}"
                f"{fmt(row['value']):>11}{change:>9}  {goal(row)}"
            )
            if row.get("ratio") is not None:
                old_ratio = rows_before.get(key, {}).get("ratio")
                print(
                    f"    {'ratio to ' + row['baseline_label']:<48}{fmt(old_ratio):>11}"
                    f"{fmt(row['ratio']):>11}"
                )
        for check in after[name]["checks"].values():
            failed |= not check["ok"]
            if not check["ok"]:
                print(f"  {check['label']:<50}{'FAILED':>22}")
    return failed


def main(argv: list[str]) -> int:
    if len(argv) == 2:
        failed = compare(load(Path(argv[0])), load(Path(argv[1])))
    else:
        failed = show(load(Path(argv[0]) if argv else RESULTS))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
