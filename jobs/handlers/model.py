"""`model`: an ordinary least-squares line fit y = a*x + b with its R^2."""

from __future__ import annotations

from typing import Any

from jobs.errors import JobValidationError
from jobs.handlers.planning import result_artefact


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    points = [(float(x), float(y)) for x, y in params["points"]]
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        raise JobValidationError("all x values are equal: no line fits", code="DEGENERATE_INPUT")
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    ctx.progress(70, step="fitted")
    ss_tot = sum((y - mean_y) ** 2 for _, y in points)
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in points)
    r2 = 1.0 if ss_tot == 0 else 1 - ss_res / ss_tot
    return result_artefact(ctx, {"slope": slope, "intercept": intercept, "r2": r2, "n": n})
