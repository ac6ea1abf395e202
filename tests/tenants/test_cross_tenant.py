"""Every read and write path tried as someone of another organisation: each answers
404 or shows nothing, never the other tenant's data (docs/tenancy.md).

Three viewpoints, one section each:
- a member and an admin of organisation B against A's jobs through the public API:
  reads, revalidation, cancel, artefact downloads, lists and filters, idempotency keys,
  placement, and the events each job emits;
- a `report` job of organisation A (its handler lists jobs), never B's;
- an operator limited to organisation B in the portal and the admin API: lists, search,
  filters, dashboard counts, job, dead-letter and audit pages, artefact downloads, bulk
  and whole-queue actions, background operations, peek, replay, discard and cancel.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from audit.models import AuditLog
from dlq.bulk import bulk_operation_start
from dlq.errors import DeadLetterNotFoundError, DeadLetterWholeQueueError
from dlq.services.replay import dead_letters_discard, dead_letters_replay
from jobs.domain.states import Status
from jobs.integrations.publisher import wire_payload
from jobs.models import Artefact, DeadLetter, Job
from jobs.processes.runtime import job_execute
from jobs.services import artefact_save
from tenants.models import Membership, OperatorScope, Organisation, Role
from tests.factories import (
    OrganisationFactory,
    StaffFactory,
    UserFactory,
    client_for,
    client_with_grant,
    dead_letter_without_job,
    fence_of,
    job_in_state,
    make_job,
    otp_login,
    role_user,
)

pytestmark = pytest.mark.django_db

# --- the public API, as a member or admin of another organisation -----------------------

SECRET = "acme-secret-marker"


def _member(org, role: str = Role.MEMBER, **kwargs):
    user = UserFactory(org=False, **kwargs)
    Membership.objects.create(user=user, organisation=org, role=role)
    return user


class Customers:
    """Org A's data and org B's people."""

    def __init__(self) -> None:
        self.acme = OrganisationFactory(slug="acme")
        self.globex = OrganisationFactory(slug="globex")
        self.a_owner = _member(self.acme)
        self.a_jobs: dict[str, Job] = {}
        for status in Status.values:
            self.a_jobs[status] = job_in_state(
                status,
                owner=self.a_owner,
                key=f"{SECRET}-{status}",
            )
        done = self.a_jobs[Status.SUCCEEDED]
        self.artefact = artefact_save(
            job_id=done.id, kind="report", name=f"{SECRET}.csv", data=SECRET.encode()
        )
        self.dead_letter = DeadLetter.objects.get(job=self.a_jobs[Status.FAILED])
        self.b_member = _member(self.globex)
        self.b_admin = _member(self.globex, Role.ADMIN)
        self.b_job = job_in_state(Status.SUCCEEDED, owner=self.b_member)

    def a_ids(self) -> set[str]:
        return {str(job.id) for job in self.a_jobs.values()} | {str(self.artefact.id)}

    def leaks(self, content: bytes | str) -> list[str]:
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
        found = [i for i in self.a_ids() if i in text]
        return found + ([SECRET] if SECRET in text else [])


@pytest.fixture
def t(settings) -> Customers:
    return Customers()


def _check_404(response, t: Customers) -> None:
    assert response.status_code == 404, (response.status_code, response.content[:300])
    assert not t.leaks(response.content)


@pytest.mark.parametrize("who", ["b_member", "b_admin"])
def test_the_jobs_api_answers_404_for_every_url_of_another_organisations_job(t, who):
    client = client_for(getattr(t, who))
    for job in t.a_jobs.values():
        url = f"/api/v1/jobs/{job.id}"
        _check_404(client.get(url), t)
        _check_404(client.get(url, HTTP_IF_NONE_MATCH=job.etag), t)
        _check_404(client.head(url), t)
        _check_404(client.post(f"{url}/cancel"), t)
        _check_404(client.get(f"{url}/artefacts/{t.artefact.id}"), t)
    done = t.a_jobs[Status.SUCCEEDED]
    # B's own job id with A's artefact id: still nothing.
    _check_404(client.get(f"/api/v1/jobs/{t.b_job.id}/artefacts/{t.artefact.id}"), t)
    assert {j.status for j in Job.objects.filter(org=t.acme)} == set(Status.values)
    assert Job.objects.get(id=t.a_jobs[Status.PENDING].id).cancel_requested is False
    assert done.artefacts.count() == 1


@pytest.mark.parametrize("who", ["b_member", "b_admin"])
def test_lists_and_filters_show_nothing_of_another_organisation(t, who):
    client = client_for(getattr(t, who))
    queries = ["", "?status=failed", "?type=sim", "?category=planning", "?page_size=200"]
    for query in queries:
        response = client.get(f"/api/v1/jobs{query}")
        assert response.status_code == 200
        assert not t.leaks(response.content), query
    ids = {j["id"] for j in client.get("/api/v1/jobs").json()["results"]}
    assert ids == {str(t.b_job.id)}  # B's member owns it; B's admin sees B's every job


def test_the_same_idempotency_key_in_another_organisation_makes_a_new_job_and_leaks_nothing(t):
    client = client_for(t.b_member)
    key = f"{SECRET}-{Status.SUCCEEDED}"
    body = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}, "idempotency_key": key}
    response = client.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 201
    assert response.json()["org_id"] == t.globex.id
    assert response.json()["id"] not in t.a_ids()
    # Other params under that key: no mismatch error naming A's job either.
    again = client.post("/api/v1/jobs", {**body, "params": {"steps": 2}}, format="json")
    assert again.status_code == 422 and not t.leaks(again.content)
    assert again.json()["error"]["details"]["job_id"] == response.json()["id"]


def test_a_b_member_cannot_place_a_job_in_a(t):
    client = client_for(t.b_member)
    body = {"type": "sim", "params": {"steps": 1}, "org": "acme"}
    response = client.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "ERR-TENANT-422"
    assert not Job.objects.filter(org=t.acme, owner=t.b_member).exists()


def test_event_payloads_name_only_their_own_organisation(t):
    from jobs.models import EventOutbox

    for event in EventOutbox.objects.filter(job_id__in=[j.id for j in t.a_jobs.values()]):
        assert event.payload["org_id"] == t.acme.id
    for event in EventOutbox.objects.filter(job_id=t.b_job.id):
        assert event.payload["org_id"] == t.globex.id
        assert not t.leaks(json.dumps(event.payload))


# --- the report handler ---------------------------------------------------------------


def _report_rows(job_id) -> set[str]:
    artefact = Artefact.objects.get(job_id=job_id)
    with artefact.file.open("rb") as handle:
        text = handle.read().decode()
    return {row[0] for row in list(csv.reader(io.StringIO(text)))[1:]}


def test_a_report_of_org_a_never_lists_org_b_jobs_even_for_all_owners(settings):
    acme = OrganisationFactory(slug="acme")
    globex = OrganisationFactory(slug="globex")
    staff = StaffFactory(org=acme)
    colleague = UserFactory(org=acme)
    outsider = UserFactory(org=globex)
    mine, theirs = make_job(owner=staff), make_job(owner=colleague)
    foreign = make_job(owner=outsider)
    report = job_in_state("queued", owner=staff, job_type="report", params={"limit": 100})
    # Staff powers' all_owners (the API grants it to verified staff): within acme still.
    Job.objects.filter(id=report.id).update(params={"all_owners": True, "limit": 100})
    assert job_execute(payload=wire_payload(report), hostname="t")["outcome"] == "succeeded"
    rows = _report_rows(report.id)
    assert {str(mine.id), str(theirs.id), str(report.id)} <= rows
    assert str(foreign.id) not in rows
    assert not Job.objects.filter(id__in=rows).exclude(org_id=acme.id).exists()


# --- the portal and the admin API, as an operator limited to another organisation ------

JOBS = "/admin/jobs/job/"
LETTERS = "/admin/jobs/deadletter/"
API = "/api/v1/admin/dlq"


@dataclass
class Tenants:
    a: Organisation
    b: Organisation
    job_a: Job  # failed, with an open dead letter
    job_b: Job
    letter_a: DeadLetter
    letter_b: DeadLetter
    orphan: Any  # a dead letter that names no job


def failed_in(org: Organisation, code: str) -> Job:
    return job_in_state("failed", owner=UserFactory(org=org), reason="exhausted", error_code=code)


@pytest.fixture
def tenants(broker) -> Tenants:
    a, b = OrganisationFactory(slug="acme"), OrganisationFactory(slug="bolt")
    job_a, job_b = failed_in(a, "A_FAILED"), failed_in(b, "B_FAILED")
    return Tenants(
        a=a,
        b=b,
        job_a=job_a,
        job_b=job_b,
        letter_a=DeadLetter.objects.get(job=job_a),
        letter_b=DeadLetter.objects.get(job=job_b),
        orphan=dead_letter_without_job(),
    )


def limited_to(org: Organisation, username: str = "bea") -> Any:
    """An operator (the `operator` role) limited to `org` by an OperatorScope."""
    user = role_user("operator", username=username)
    OperatorScope.objects.create(user=user).organisations.add(org)
    return user


@pytest.fixture
def bea(tenants) -> Client:
    """An OTP-verified operator limited to organisation B."""
    return otp_login(Client(), limited_to(tenants.b))


@pytest.fixture
def olga(tenants) -> Client:
    """An OTP-verified operator who is not limited."""
    return otp_login(Client(), role_user("operator", username="olga"))


def listed(client: Client, url: str, **query: str) -> list[Any]:
    page = client.get(url, query)
    assert page.status_code == 200
    return list(page.context["cl"].result_list)


# --- what they see ----------------------------------------------------------------------


def test_a_limited_operator_lists_only_their_organisations_jobs_and_dead_letters(
    tenants, bea, olga
):
    assert [j.id for j in listed(bea, JOBS)] == [tenants.job_b.id]
    assert [r.id for r in listed(bea, LETTERS)] == [tenants.letter_b.id]
    page = bea.get(LETTERS, {"state": "open"})
    assert [g["error_code"] for g in page.context["groups"]] == ["B_FAILED"]
    assert b"A_FAILED" not in page.content and str(tenants.job_a.id).encode() not in page.content
    # The unrestricted operator sees both, and the row that names no job.
    assert {j.id for j in listed(olga, JOBS)} >= {tenants.job_a.id, tenants.job_b.id}
    assert {r.id for r in listed(olga, LETTERS)} == {
        tenants.letter_a.id,
        tenants.letter_b.id,
        tenants.orphan.id,
    }


def test_search_and_filters_find_nothing_of_another_organisation(tenants, bea, olga):
    # Whole, and its end (ids made together share their start: their time).
    for term in (str(tenants.job_a.id), str(tenants.job_a.id)[-8:]):
        assert listed(bea, JOBS, q=term) == []
        assert listed(bea, LETTERS, q=term) == []
        assert [j.id for j in listed(olga, JOBS, q=term)] == [tenants.job_a.id]
    assert listed(bea, JOBS, org=str(tenants.a.pk)) == []  # a guessed filter value
    assert listed(bea, LETTERS, error_code="A_FAILED") == []
    # The organisation filter offers the viewer's organisations only; the unrestricted
    # operator filters by either.
    page = bea.get(JOBS)
    offered = {slug for spec in page.context["cl"].filter_specs for _, slug in _lookups(spec)}
    assert "bolt" in offered and "acme" not in offered
    assert [j.id for j in listed(olga, JOBS, org=str(tenants.a.pk))] == [tenants.job_a.id]
    assert b"acme" in olga.get(JOBS).content  # the organisation column


def _lookups(spec: Any) -> list[tuple[Any, str]]:
    return list(getattr(spec, "lookup_choices", []) or [])


def test_the_dashboard_counts_only_the_chosen_or_allowed_organisations(tenants, bea, olga):
    mine = bea.get("/admin/").context
    assert mine["overview"]["health"]["open_dead_letters"] == 1
    assert [o.slug for o in mine["organisations"]] == ["bolt"]
    sim = next(q for q in mine["overview"]["queues"] if q["queue"] == "sim")
    assert (sim["open_dead_letters"], sim["depth"], sim["dlq_depth"]) == (1, None, None)
    assert [f["error_code"] for f in mine["overview"]["failures"]] == ["B_FAILED"]
    # A slug that is not theirs changes nothing: still their organisations only.
    assert (
        bea.get("/admin/", {"org": "acme"}).context["overview"]["health"]["open_dead_letters"] == 1
    )
    everyone = olga.get("/admin/").context
    assert everyone["overview"]["health"]["open_dead_letters"] == 3
    assert {o.slug for o in everyone["organisations"]} >= {"acme", "bolt"}
    acme = olga.get("/admin/", {"org": "acme"})
    assert acme.context["overview"]["health"]["open_dead_letters"] == 1
    assert [f["error_code"] for f in acme.context["overview"]["failures"]] == ["A_FAILED"]
    assert b'data-refresh-url="/admin/dashboard/panel/?org=acme"' in acme.content
    panel = olga.get("/admin/dashboard/panel/", {"org": "bolt"})
    assert panel.context["overview"]["health"]["open_dead_letters"] == 1


def test_another_organisations_pages_are_not_found(tenants, bea, settings, tmp_path):
    from jobs.services import artefact_save, job_claim

    settings.MEDIA_ROOT = tmp_path
    job = job_in_state("queued", owner=UserFactory(org=tenants.a))
    claimed = job_claim(job_id=job.id, locked_by="w1")
    assert claimed is not None
    fence = fence_of(claimed)
    artefact = artefact_save(job_id=job.id, kind="report", name="a.csv", data="a\n", fence=fence)
    for url in (
        f"{JOBS}{job.id}/change/",
        f"{JOBS}{job.id}/live/",
        f"{JOBS}{job.id}/cancel/",
        f"{JOBS}{job.id}/artefacts/{artefact.id}/",
        f"{JOBS}{tenants.job_a.id}/change/",
    ):
        page = bea.get(url)
        assert page.status_code == 404, url
        assert str(job.id).encode() not in page.content or url.endswith("change/")
    assert bea.post(f"{JOBS}{job.id}/cancel/").status_code == 404
    assert Job.objects.get(id=job.id).status == "running"
    # The dead-letter page: the admin's "does not exist" redirect, nothing of A shown.
    page = bea.get(f"{LETTERS}{tenants.letter_a.id}/change/", follow=True)
    assert b"A_FAILED" not in page.content and b"doesn" in page.content
    orphan = bea.get(f"{LETTERS}{tenants.orphan.id}/change/", follow=True)
    assert b"not a celery message" not in orphan.content


# --- what they may do -----------------------------------------------------------------------


def test_a_limited_operator_cannot_replay_discard_or_cancel_anothers_from_the_pages(tenants, bea):
    run = f"{LETTERS}replay/run/"
    page = bea.post(run, {"ids": str(tenants.letter_a.id), "justification": "try"})
    assert b"A_FAILED" not in page.content
    page = bea.post(f"{LETTERS}discard/run/", {"job": str(tenants.job_a.id), "justification": "x"})
    assert page.context["error"] == "No such dead letter."
    # Bulk actions of the lists: rows of A are not among the selectable ones.
    bea.post(
        LETTERS,
        {"action": "replay_selected", "_selected_action": [str(tenants.letter_a.id)]},
    )
    bea.post(
        JOBS,
        {"action": "cancel_jobs", "_selected_action": [str(tenants.job_a.id)], "confirm": "yes"},
    )
    assert DeadLetter.objects.get(id=tenants.letter_a.id).state == "open"
    assert DeadLetter.objects.get(id=tenants.orphan.id).state == "open"
    assert Job.objects.get(id=tenants.job_a.id).status == "failed"


def test_whole_queue_controls_are_hidden_and_refused_for_a_limited_operator(tenants, bea, olga):
    for action in ("replay", "discard"):
        assert bea.get(f"{LETTERS}{action}/run/", {"queue": "sim_dlq"}).status_code == 403
        assert (
            bea.post(
                f"{LETTERS}{action}/run/", {"queue": "sim_dlq", "justification": "all"}
            ).status_code
            == 403
        )
        assert bea.get(f"{LETTERS}{action}/run/", {"reason": "exhausted"}).status_code == 403
    listing = bea.get(LETTERS, {"state": "open"}).content
    assert b'id="all-matching"' not in listing and b"Replay 1" not in listing
    queues = bea.get(f"{LETTERS}queues/panel/").content
    assert b"?queue=sim_dlq" not in queues.replace(b"state=open&amp;queue=sim_dlq", b"")
    assert b'id="limited-note"' in queues
    # The unrestricted operator keeps them.
    assert b'id="all-matching"' in olga.get(LETTERS, {"state": "open"}).content
    assert olga.get(f"{LETTERS}replay/run/", {"queue": "sim_dlq"}).status_code == 200
    assert DeadLetter.objects.filter(state="open").count() == 3


def test_the_services_refuse_a_limited_operator_anothers_rows_and_whole_queues(tenants):
    bea = limited_to(tenants.b)
    with pytest.raises(DeadLetterNotFoundError):
        dead_letters_replay(
            actor_user=bea, justification="x", dead_letter_ids=[tenants.letter_a.id]
        )
    with pytest.raises(DeadLetterNotFoundError):
        dead_letters_discard(actor_user=bea, justification="x", job_ids=[tenants.job_a.id])
    with pytest.raises(DeadLetterNotFoundError):
        dead_letters_discard(actor_user=bea, justification="x", dead_letter_ids=[tenants.orphan.id])
    with pytest.raises(DeadLetterWholeQueueError):
        dead_letters_discard(actor_user=bea, justification="x", queue="sim_dlq")
    with pytest.raises(DeadLetterWholeQueueError):
        bulk_operation_start(action="replay", actor_user=bea, justification="x")
    assert DeadLetter.objects.filter(state="open").count() == 3


def test_the_admin_api_answers_404_for_another_organisations_dead_letters(tenants):
    api = client_with_grant(limited_to(tenants.b))
    for action in ("replay", "discard"):
        # The API selects by job (or a whole queue, which a limited operator may not).
        for body in ({"job_ids": [str(tenants.job_a.id)]},):
            answer = api.post(
                f"{API}/sim_dlq/{action}", {**body, "justification": "x"}, format="json"
            )
            assert answer.status_code == 404, (action, body)
            assert answer.json()["error"]["code"] == "ERR-DLQ-404"
        whole = api.post(f"{API}/sim_dlq/{action}", {"justification": "all"}, format="json")
        assert whole.status_code == 403 and whole.json()["error"]["code"] == "ERR-DLQ-403"
    listing = {q["queue"]: q for q in api.get(API).json()}
    assert (listing["sim_dlq"]["open"], listing["sim_dlq"]["depth"]) == (1, None)
    assert "unknown" not in listing or listing["unknown"]["open"] == 0
    assert DeadLetter.objects.filter(state="open").count() == 3
    # Their own organisation's row they replay.
    mine = api.post(
        f"{API}/sim_dlq/replay",
        {"job_ids": [str(tenants.job_b.id)], "justification": "fixed"},
        format="json",
    )
    assert mine.status_code == 200 and mine.json()["resolved"] == [tenants.letter_b.id]


def test_the_api_peek_shows_a_limited_operator_only_their_messages(amqp, tenants):
    from tests.queues import worker_dead_letter

    in_a, in_b = worker_dead_letter(amqp, code="PEEK_A"), worker_dead_letter(amqp, code="PEEK_B")
    Job.objects.filter(id=in_a.id).update(org=tenants.a)
    Job.objects.filter(id=in_b.id).update(org=tenants.b)
    seen = client_with_grant(limited_to(tenants.b)).get(f"{API}/sim_dlq/peek")
    assert seen.status_code == 200
    assert [m["job_id"] for m in seen.json()] == [str(in_b.id)]
    everyone = client_with_grant(role_user("operator", username="olga")).get(f"{API}/sim_dlq/peek")
    assert {m["job_id"] for m in everyone.json()} == {str(in_a.id), str(in_b.id)}


def test_another_operators_background_operation_is_not_found(tenants):
    olga = role_user("operator", username="olga")
    operation = bulk_operation_start(
        action="discard", actor_user=olga, justification="x", queue="sim_dlq"
    )
    api = client_with_grant(limited_to(tenants.b))
    assert api.get(f"{API}/operations/{operation.id}").status_code == 404
    assert api.post(f"{API}/operations/{operation.id}/stop").status_code == 404
    page = otp_login(Client(), limited_to(tenants.b, username="ben"))
    assert page.get(f"/admin/dlq/bulkoperation/{operation.id}/change/").status_code == 404
    assert list(page.get("/admin/dlq/bulkoperation/").context["cl"].result_list) == []


# --- audited as an operator -----------------------------------------------------------------


def test_portal_actions_are_audited_with_actor_type_operator(tenants, bea):
    page = bea.post(
        f"{LETTERS}replay/run/", {"ids": str(tenants.letter_b.id), "justification": "fixed"}
    )
    assert page.status_code == 200, page.content[:300]
    replayed = AuditLog.objects.get(job_id=tenants.job_b.id, event_type="dlq_replayed")
    assert (replayed.actor_type, replayed.actor_id) == ("operator", str(bea.user.pk))
    running = job_in_state("running", owner=UserFactory(org=tenants.b))
    bea.post(f"{JOBS}{running.id}/cancel/")
    waiting = job_in_state("pending", owner=UserFactory(org=tenants.b))
    bea.post(
        JOBS,
        {"action": "cancel_jobs", "_selected_action": [str(waiting.id)], "confirm": "yes"},
    )
    for job in (running, waiting):
        entry = AuditLog.objects.filter(job_id=job.id).order_by("-seq").first()
        assert entry.event_type in ("cancel_requested", "cancelled"), entry.event_type
        assert entry.actor_type == "operator"
    discard = client_with_grant(bea.user).post(
        f"{API}/sim_dlq/discard",
        {"job_ids": [str(tenants.job_b.id)], "justification": "gone"},
        format="json",
    )
    assert discard.status_code == 200


def test_the_audit_log_pages_show_a_limited_operator_their_organisations_entries(tenants, bea):
    entries = listed(bea, "/admin/audit/auditlog/")
    assert entries and {e.job_id for e in entries} == {tenants.job_b.id}
    verify = "/admin/audit/auditlog/verify/"
    assert bea.get(verify, {"run": "1", "job": str(tenants.job_b.id)}).status_code == 200
    assert bea.get(verify, {"run": "1", "job": str(tenants.job_a.id)}).status_code == 403
    assert bea.get(verify, {"run": "1"}).status_code == 403  # every chain: every tenant's
