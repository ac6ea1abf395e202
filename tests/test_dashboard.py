"""The dashboard on a big table: a bounded number of queries, whatever the jobs count."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from tests.factories import default_org, job_failed, otp_login, role_user

pytestmark = pytest.mark.django_db
MILLION = 1_000_000

# A realistic million: nearly all ended over the last 30 days, a few hundred unfinished.
FILL = """
INSERT INTO jobs (id, type, category, queue, params, params_hash, status, owner_id, org_id,
                  cancel_requested, attempts, max_attempts, progress_percent, version,
                  created_at, updated_at, locked_by, locked_at)
SELECT gen_random_uuid(), t.type, t.category, t.queue, '{}'::jsonb, 'x', s.status, %(owner)s,
       %(org)s, false,
       1, 6, 0, 1, now() - make_interval(secs => g %% (30 * 86400)), now(),
       CASE WHEN s.status = 'running' THEN 'w' END,
       CASE WHEN s.status = 'running' THEN now() END
  FROM generate_series(1, %(n)s) AS g
  CROSS JOIN LATERAL (SELECT (ARRAY['sim', 'report', 'erp', 'ai'])[1 + g %% 4] AS type) AS k
  CROSS JOIN LATERAL (SELECT k.type, CASE k.type WHEN 'ai' THEN 'default' ELSE k.type END
                      AS queue, CASE k.type WHEN 'report' THEN 'import_export'
                      WHEN 'erp' THEN 'notification' ELSE 'planning' END AS category) AS t
  CROSS JOIN LATERAL (SELECT CASE WHEN g %% 1000 = 0 THEN 'pending'
                                  WHEN g %% 1000 = 1 THEN 'queued'
                                  WHEN g %% 1000 = 2 THEN 'running'
                                  WHEN g %% 1000 = 3 THEN 'retrying'
                                  WHEN g %% 100 = 4 THEN 'failed'
                                  WHEN g %% 100 = 5 THEN 'cancelled'
                                  ELSE 'succeeded' END AS status) AS s
"""


def _dashboard_queries(client: Client) -> tuple[int, float]:
    started = time.monotonic()
    with CaptureQueriesContext(connection) as queries:
        page = client.get("/admin/")
    assert page.status_code == 200
    return len(queries), time.monotonic() - started


# A million rows written and analysed: a scale run, left to make test-heavy
# (docs/development.md#the-test-budget).
@pytest.mark.heavy
def test_the_dashboard_costs_the_same_few_queries_on_a_million_jobs(
    broker, django_assert_max_num_queries
):
    operator = role_user("operator")
    client = otp_login(Client(), operator)
    job_failed("TRANSIENT_EXTERNAL", job_type="erp")
    small, _ = _dashboard_queries(client)
    with connection.cursor() as cursor:
        cursor.execute(FILL, {"owner": operator.pk, "org": default_org().pk, "n": MILLION})
        cursor.execute("ANALYZE jobs")
    with django_assert_max_num_queries(small):
        page = client.get("/admin/")
    overview = page.context["overview"]
    assert sum(q["finished"]["succeeded"] for q in overview["queues"]) > 25_000  # last 24 h
    assert sum(sum(q["unfinished"].values()) for q in overview["queues"]) == 4 * MILLION // 1000
    big, seconds = _dashboard_queries(client)
    print(f"dashboard: {small} queries with one job, {big} with a million; {seconds:.2f} s")
    # 18: the queue pauses and the connectors' breakers are read fresh beside the
    # cached snapshot (a pause or an opened breaker shows at the next refresh;
    # docs/operator-controls.md#pausing-a-queue, docs/connectors.md): a scan of a
    # handful of rows each, the same on a million jobs; so is the audit verification
    # tile's newest run of each mode (two index probes of the ops chain,
    # audit/verification_runs.py). The operator's scope is read once per request
    # (tenants.selectors.operator_org_ids).
    assert big == small <= 18, (small, big)
    assert seconds < 5, f"the dashboard took {seconds:.2f} s on a million jobs"
