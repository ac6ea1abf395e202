"""Bench-only settings: the real app, one bare DRF endpoint and the profiling hooks.

- The bare endpoint (bench/urls_bench.py) authenticates exactly like the API (DRF
  token auth, same middleware) and inserts one row, so `bench/api.py` can put the cost
  of POST /api/v1/jobs beside the floor of "an authenticated DRF POST that writes".
- `bench._profiling.install()` adds the SQL trace (BENCH_TRACE_DIR) and the worker's
  cProfile (BENCH_CPROFILE) when a benchmark asks for them; otherwise nothing.
"""

from bench import _profiling
from config.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls_bench"

_profiling.install()
