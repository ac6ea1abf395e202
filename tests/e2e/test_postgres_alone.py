"""PostgreSQL alone (docs/smallest-deployment.md): gunicorn, the dispatcher and run_worker
with JOBOPS_BROKER and JOBOPS_REDIS off, and RabbitMQ's and Redis' URLs pointing at
closed ports, so that any use of either fails loudly; then the README's first-job walk
through, over HTTP."""

from __future__ import annotations

import json

import pytest
import requests
from rest_framework.authtoken.models import Token

from tests.e2e.live_api import gunicorn_server
from tests.factories import OrganisationFactory, role_user, totp_code, totp_device
from tests.polling import wait_for
from tests.processes import dispatcher_process, free_port, run_manage, run_worker_process

# A whole deployment (gunicorn, the dispatcher, run_worker) walked through over HTTP:
# `heavy` (docs/development.md#the-test-budget). make test holds its parts in smaller
# cases: run_worker without the broker (tests/e2e/test_postgres_executor.py), the API
# with the broker and Redis off (tests/jobs/test_brokerless.py), these settings starting
# (tests/test_settings.py::test_postgres_alone_starts_with_every_queue_on_postgres).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

QUEUES = ("DEFAULT", "MODEL", "CAM", "SIM", "REPORT", "ERP")
CREATE_PER_USER = 8


def postgres_alone_env() -> dict[str, str]:
    # The settings `make run` uses (the test settings lift the rate limits), on the test
    # database.
    return {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "true",
        "JOBOPS_BROKER": "off",
        "JOBOPS_REDIS": "off",
        **{f"JOBOPS_EXECUTOR_{q}": "postgres" for q in QUEUES},
        # Nothing listens there: a connection attempt would fail, not pass unseen.
        "BROKER_URL": f"amqp://guest:guest@127.0.0.1:{free_port()}//",
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "JOBOPS_RATE_LIMITS": json.dumps({"create_per_user": CREATE_PER_USER}),
        "JOBOPS_READY_CACHE_SECONDS": "0",
    }


@pytest.fixture
def deployment():
    env = postgres_alone_env()
    with (
        gunicorn_server(workers=2, threads=4, env=env) as base,
        dispatcher_process(env=env, name="pg-alone-dispatcher") as dispatcher,
        run_worker_process(concurrency=2, env=env, name="pg-alone-worker") as worker,
    ):
        yield base, env, (dispatcher, worker)


def test_the_readme_walk_through_runs_on_postgresql_alone(deployment):
    base, env, processes = deployment
    api = f"{base}/api/v1"

    ready = requests.get(f"{base}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"postgres": {"ok": True}}
    assert ready.json()["off"] == ["rabbitmq", "redis"]

    # 1. A token, as the README makes it: the default organisation's service account
    #    (the organisation a migration made, and a transactional test may have flushed).
    OrganisationFactory(slug="default")
    made = run_manage("org", "token", "default", "readme", "--quiet", env=_manage_env(env))
    assert made.returncode == 0, made.stdout + made.stderr
    auth = {"Authorization": f"Token {made.stdout.strip().splitlines()[-1]}"}

    # 2. Create a job: 201, Location, ETag.
    body = {"type": "sim", "params": {"steps": 4, "step_seconds": 0.1}}
    keyed = {**auth, "Idempotency-Key": "demo-1"}
    created = requests.post(f"{api}/jobs", json=body, headers=keyed, timeout=10)
    assert created.status_code == 201, created.text
    job = created.json()
    assert created.headers["Location"].endswith(f"/api/v1/jobs/{job['id']}")
    assert created.headers["ETag"]

    # 3. The same request: 200 and the same job; other params: 422.
    again = requests.post(f"{api}/jobs", json=body, headers=keyed, timeout=10)
    assert (again.status_code, again.json()["id"]) == (200, job["id"])
    other = {"type": "sim", "params": {"steps": 5, "step_seconds": 0.1}}
    mismatch = requests.post(f"{api}/jobs", json=other, headers=keyed, timeout=10)
    assert mismatch.status_code == 422
    assert mismatch.json()["error"]["code"] == "ERR-JOB-IDEMPOTENCY-MISMATCH"

    # 4. Poll with If-None-Match until it succeeded (run_worker ran it, no broker).
    done = _wait_status(api, auth, job["id"], "succeeded")
    assert done["progress"]["percent"] == 100
    etag = requests.get(f"{api}/jobs/{job['id']}", headers=auth, timeout=10).headers["ETag"]
    unchanged = requests.get(
        f"{api}/jobs/{job['id']}", headers={**auth, "If-None-Match": etag}, timeout=10
    )
    assert unchanged.status_code == 304

    # 5. Cancel a long one while it runs; cancel is idempotent.
    long = {"type": "sim", "params": {"steps": 40, "step_seconds": 0.5}}
    running = requests.post(f"{api}/jobs", json=long, headers=auth, timeout=10).json()
    _wait_status(api, auth, running["id"], "running")
    for _ in range(2):
        cancel = requests.post(f"{api}/jobs/{running['id']}/cancel", headers=auth, timeout=10)
        assert cancel.status_code == 200
    _wait_status(api, auth, running["id"], "cancelled")

    # 6. A report job writes a CSV artefact, downloadable from its url.
    report = requests.post(
        f"{api}/jobs", json={"type": "report", "params": {"limit": 100}}, headers=auth, timeout=10
    ).json()
    finished = _wait_status(api, auth, report["id"], "succeeded")
    (artefact,) = finished["artefacts"]
    download = requests.get(artefact["url"], headers=auth, timeout=10)
    assert download.status_code == 200 and download.content

    # 7. The rate limit, from PostgreSQL: a burst of one more create than the bucket
    #    holds meets a 429 (the POSTs above counted too, less what refilled since).
    answers = []
    for _ in range(CREATE_PER_USER + 1):
        answers.append(requests.post(f"{api}/jobs", json=body, headers=auth, timeout=10))
        if answers[-1].status_code != 201:
            break
    refused = answers[-1]
    assert refused.status_code == 429, [a.status_code for a in answers]
    assert refused.json()["error"]["code"] == "ERR-JOB-RATE-LIMIT"
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["RateLimit-Remaining"] == "0"

    # 8. An OTP grant (kept in PostgreSQL) lets a staff token make an admin call.
    staff = role_user("viewer")
    key = Token.objects.create(user=staff).key
    device = totp_device(staff)
    staff_auth = {"Authorization": f"Token {key}"}
    assert requests.get(f"{api}/admin/dlq", headers=staff_auth, timeout=10).status_code == 401
    granted = requests.post(
        f"{api}/admin/otp", json={"otp_token": totp_code(device)}, headers=staff_auth, timeout=10
    )
    assert granted.status_code == 200, granted.text
    overview = requests.get(f"{api}/admin/dlq", headers=staff_auth, timeout=10)
    assert overview.status_code == 200, overview.text

    # 9. The processes are alive (heartbeats in PostgreSQL), and none met a broker or Redis.
    alive = run_manage("liveness", "--json", env=_manage_env(env))
    assert alive.returncode == 0, alive.stdout + alive.stderr  # nothing missing
    found = json.loads(alive.stdout)["processes"]
    assert found.get("dispatcher") and found.get("run_worker"), alive.stdout
    for process in processes:
        log = process.log_text()
        assert process.alive(), log[-2000:]
        for trace in ("Connection refused", "amqp", "redis.exceptions", "dispatcher_step_failed"):
            assert trace not in log, f"{process.name}: {trace}\n{log[-3000:]}"


def _manage_env(env: dict[str, str]) -> dict[str, str]:
    from tests.processes import subprocess_env

    return subprocess_env(**env)


def _wait_status(api: str, auth: dict[str, str], job_id: str, status: str) -> dict:
    seen: dict = {}

    def reached() -> bool:
        seen.update(requests.get(f"{api}/jobs/{job_id}", headers=auth, timeout=10).json())
        return seen["status"] == status

    wait_for(reached, timeout=40, what=f"job {job_id} to be {status}")
    return seen
