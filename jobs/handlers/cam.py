"""`cam`: a zig-zag (raster) pocketing toolpath for a rectangular pocket.

The tool centre stays tool_diameter/2 inside the walls; passes are stepover x
tool_diameter apart; the result is the number of passes and the cutting length. The
path is counted, not built: its size follows from the number of passes, which the
params schema bounds (jobs.domain.params.CamParams.MAX_PASSES).
"""

from __future__ import annotations

from typing import Any

from jobs.domain.params import cam_passes
from jobs.errors import JobValidationError
from jobs.handlers.planning import result_artefact


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    width, height = params["width"], params["height"]
    tool = params["tool_diameter"]
    inner_w, inner_h = width - tool, height - tool
    if inner_w < 0 or inner_h < 0:
        raise JobValidationError("the tool does not fit in the pocket", code="TOOL_TOO_LARGE")
    passes = cam_passes(height, tool, params["stepover"])
    spacing = inner_h / (passes - 1) if passes > 1 else 0.0
    # Each pass cuts the inner width; between passes the tool steps over by `spacing`.
    length = passes * inner_w + (passes - 1) * spacing
    ctx.progress(90, step="toolpath")
    return result_artefact(
        ctx, {"passes": passes, "length": round(length, 6), "points": 2 * passes}
    )
