"""gunicorn's settings for the web process: the Procfile's `web:` line and the tests'
live server (tests/e2e/live_api.py) both start gunicorn with `-c config/gunicorn.conf.py`.

The request limits sit above Django's own (core.middleware.RequestLimitsMiddleware), so
that an oversized request line or header reaches Django and is answered in the API's
error envelope (414 ERR-HTTP-414, 431 ERR-HTTP-431). Only what is beyond these limits
gunicorn answers itself, with its own short HTML page. They read the same variables as
config/settings.py, so raising a Django limit raises gunicorn's with it.
"""

import os


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


# gunicorn's maximum: the longest URI Django then sees is JOBOPS_MAX_URI_CHARS (4096,
# at most 8000) plus room for the method and the protocol.
limit_request_line = 8190
# Twice Django's limits: a header of 16 KiB (a long session cookie is normal) to 32 KiB,
# or 101 to 200 headers, is refused by Django in the envelope, not by gunicorn.
limit_request_field_size = 2 * _env_int("JOBOPS_MAX_HEADER_BYTES", 16 * 1024)
limit_request_fields = 2 * _env_int("JOBOPS_MAX_HEADERS", 100)
