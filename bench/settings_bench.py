"""Bench-only settings: the real app plus one bare DRF endpoint (bench/urls_bench.py).

The bare endpoint authenticates exactly like the API (DRF token auth, same middleware)
and inserts one row, so `bench/api.py` can put the cost of POST /api/v1/jobs beside
the floor of "an authenticated DRF POST that writes something".
"""

from config.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls_bench"
