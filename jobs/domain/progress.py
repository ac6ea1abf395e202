"""The bounds of a progress value's metrics (`ctx.progress(..., metrics={...})`,
docs/architecture.md#the-handler-contract).

Metrics are a handler's numbers of the moment (a loss, a residual, points cut so far):
shown with the job's progress in the API and the portal and stored on the job row with
the progress value, never in its audit entry (hashed payloads carry no floats). A
handler calls progress at every step, so the bounds keep each write small and its
shape predictable for whoever reads it: names a column or a label can carry, numbers
JSON and every consumer read exactly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from jobs.domain.errors import ProgressMetricsError

MAX_METRICS = 20
# The metrics as compact JSON. The key bounds keep 20 metrics under 2 KB; this bound
# holds the write and the API's body to 4 KB whatever the others become.
MAX_METRICS_BYTES = 4096
MAX_KEY_LENGTH = 64
# Identifier-like: a letter or underscore first, then letters, digits, `_` and `.`
# (a namespace: `loss.train`).
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
# Beyond this an integer loses digits in a JSON reader that holds numbers as doubles.
MAX_EXACT_INT = 2**53 - 1


def metrics_checked(metrics: Mapping[str, Any] | None) -> dict[str, int | float] | None:
    """`metrics` as stored (a plain dict; None for none or an empty mapping), or
    ProgressMetricsError naming what is wrong: not a mapping, more than MAX_METRICS
    keys, a key that is not identifier-like or longer than MAX_KEY_LENGTH, a value that
    is not an int or float (a bool is refused: it is no measurement), not finite (NaN,
    infinity) or an integer beyond what JSON carries exactly, or more than
    MAX_METRICS_BYTES of JSON."""
    if metrics is None:
        return None
    if not isinstance(metrics, Mapping):
        raise ProgressMetricsError(f"metrics must be a mapping, not {type(metrics).__name__}")
    if len(metrics) > MAX_METRICS:
        raise ProgressMetricsError(f"metrics has {len(metrics)} keys (at most {MAX_METRICS})")
    checked: dict[str, int | float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH or not KEY.fullmatch(key):
            raise ProgressMetricsError(
                f"metric name {str(key)[:MAX_KEY_LENGTH]!r} is not an identifier of at most "
                f"{MAX_KEY_LENGTH} characters (letters, digits, '_', '.'; not a digit first)"
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProgressMetricsError(
                f"metric {key!r} is a {type(value).__name__}, not a number (int or float)"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ProgressMetricsError(f"metric {key!r} is {value} (finite numbers only)")
        if isinstance(value, int) and abs(value) > MAX_EXACT_INT:
            raise ProgressMetricsError(f"metric {key!r} is beyond ±(2**53 - 1)")
        checked[key] = int(value) if isinstance(value, int) else float(value)
    size = len(json.dumps(checked, separators=(",", ":")))
    if size > MAX_METRICS_BYTES:
        raise ProgressMetricsError(
            f"metrics are {size} bytes of JSON (at most {MAX_METRICS_BYTES})"
        )
    return checked or None
