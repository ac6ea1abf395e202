"""`sim`: a stepped simulation (a damped random walk) with progress and cancellation points."""

from __future__ import annotations

import random
import time
from typing import Any

from jobs.handlers.planning import result_artefact


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    steps, step_seconds = params["steps"], params["step_seconds"]
    rng = random.Random(params["seed"])  # deterministic: reruns agree
    position, velocity, total = 0.0, 0.0, 0.0
    for step in range(1, steps + 1):
        ctx.check_cancel()
        velocity = 0.9 * velocity + rng.gauss(0.0, 1.0)
        position += velocity
        total += position
        if step_seconds:
            time.sleep(step_seconds)
        ctx.progress(100 * step // steps, step=f"{step}/{steps}", message=f"x={position:.3f}")
    mean = total / steps
    return result_artefact(
        ctx, {"steps": steps, "final": round(position, 6), "mean": round(mean, 6)}
    )
