"""`cam`: a zig-zag (raster) pocketing toolpath for a rectangular pocket.

The tool centre stays tool_diameter/2 inside the walls; passes are stepover x
tool_diameter apart; the result is the number of passes and the cutting length.
"""

from __future__ import annotations

import math
from typing import Any

from jobs.errors import JobValidationError


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    width, height = float(params["width"]), float(params["height"])
    tool = float(params.get("tool_diameter", 6.0))
    stepover = float(params.get("stepover", 0.5)) * tool
    inner_w, inner_h = width - tool, height - tool
    if inner_w < 0 or inner_h < 0:
        raise JobValidationError("the tool does not fit in the pocket", code="TOOL_TOO_LARGE")
    passes = max(1, math.ceil(inner_h / stepover) + 1) if inner_h > 0 else 1
    spacing = inner_h / (passes - 1) if passes > 1 else 0.0
    # Each pass cuts the inner width; between passes the tool steps over by `spacing`.
    length = passes * inner_w + (passes - 1) * spacing
    ctx.progress(90, step="toolpath")
    points = []
    for i in range(passes):
        y = i * spacing
        xs = (0.0, inner_w) if i % 2 == 0 else (inner_w, 0.0)
        points.extend([(xs[0], y), (xs[1], y)])
    return {"passes": passes, "length": round(length, 6), "points": len(points)}
