"""`sim`: a stepped simulation (a damped random walk) with progress and cancellation points."""

from __future__ import annotations

import random
import time
from typing import Any


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    steps = int(params.get("steps", 20))
    step_seconds = float(params.get("step_seconds", 0.5))
    rng = random.Random(int(params.get("seed", 0)))  # deterministic: reruns agree
    position, velocity, path = 0.0, 0.0, []
    for step in range(1, steps + 1):
        ctx.check_cancel()
        velocity = 0.9 * velocity + rng.gauss(0.0, 1.0)
        position += velocity
        path.append(position)
        if step_seconds:
            time.sleep(step_seconds)
        ctx.progress(100 * step // steps, step=f"{step}/{steps}", message=f"x={position:.3f}")
    mean = sum(path) / len(path)
    return {"steps": steps, "final": round(position, 6), "mean": round(mean, 6)}
