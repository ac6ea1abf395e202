"""The OpenAPI document under concurrent requests (core.api.schema.SchemaApi)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Eight threads of a fresh process ask for the schema at once, twice each: the first
# generation in a process loads drf-spectacular's extensions, and two generations at
# once read each other's half-set state (before the view's lock: 500s, AttributeError
# "'NoneType' object has no attribute 'startswith'", in every such run).
FIRST_REQUESTS_AT_ONCE = """
import json, threading, django
django.setup()
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()  # the test client's host, as in the suite
statuses, bodies, errors = [], set(), []
start = threading.Barrier(8)
# Each test client loads the middleware chain on its first request; django-prometheus
# registers its middleware metrics then, not thread-safely (a WSGI server loads the
# chain once per process, before it serves). Loaded here, one client after another, so
# that what the threads do at once is the schema's first generation alone.
clients = [Client(raise_request_exception=False) for _ in range(8)]
for client in clients:
    client.handler.load_middleware()
def fetch(client):
    start.wait()
    try:
        for _ in range(2):
            response = client.get("/api/v1/schema/?format=json")
            statuses.append(response.status_code)
            bodies.add(response.content)
    except Exception as exc:  # a request that raised past the handler: named in the answer
        errors.append(repr(exc)[:500])
threads = [threading.Thread(target=fetch, args=(client,)) for client in clients]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"statuses": statuses, "documents": len(bodies), "errors": errors}))
"""


def test_the_first_schema_requests_of_a_process_at_once_all_answer_the_same_document():
    done = subprocess.run(
        [sys.executable, "-c", FIRST_REQUESTS_AT_ONCE],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["statuses"] == [200] * 16, (answer["errors"], done.stderr[-3000:])
    assert answer["documents"] == 1
