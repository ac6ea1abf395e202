"""The job list's search by params (docs/operator-controls.md#searching-jobs) and the
filters a cancel by filter shares with it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.http import QueryDict
from django.test import Client

from jobs.models import Job
from jobs.selectors import (
    JobFilter,
    JobFilterError,
    job_filter_from_list,
    jobs_filtered,
    jobs_search,
    param_term_parse,
)
from tenants.models import OperatorScope
from tests.factories import OrganisationFactory, UserFactory, make_job, otp_login, role_user

pytestmark = pytest.mark.django_db


def _sim(steps: int, **extra: object) -> Job:
    return make_job(params={"steps": steps, "step_seconds": 0, **extra})


def test_param_term_finds_jobs_by_value_and_misses_others():
    two, three = _sim(2), _sim(3)
    found = jobs_search(jobs=Job.objects.all(), term="param:steps=2")
    assert found.note is None and list(found.rows) == [two]
    assert list(jobs_search(jobs=Job.objects.all(), term="PARAM:steps=3").rows) == [three]
    # "2" quoted is a string: no job holds steps as text.
    assert not jobs_search(jobs=Job.objects.all(), term='param:steps="2"').rows.exists()


def test_param_term_reads_nested_keys_and_text_values():
    assert param_term_parse("param:a.b=1") == {"a": {"b": 1}}
    assert param_term_parse("param:region=eu west") == {"region": "eu west"}
    assert param_term_parse("param:ok=true") == {"ok": True}


@pytest.mark.parametrize(
    "term",
    ["param:", "param:steps", "param:=2", "param:st eps=2", "param:a.b.c.d.e=1", "param:x=NaN"],
)
def test_a_malformed_param_term_matches_nothing_and_says_why(term):
    _sim(2)
    found = jobs_search(jobs=Job.objects.all(), term=term)
    if term == "param:x=NaN":  # not JSON: the text "NaN", which no job holds
        assert found.note is None and not found.rows.exists()
        return
    assert not found.rows.exists()
    assert found.note and found.note.startswith("Nothing searched:")


def test_a_params_filter_is_bounded_in_depth_and_length():
    with pytest.raises(JobFilterError, match="levels deep"):
        param_term_parse("param:a=[[[[1]]]]")
    with pytest.raises(JobFilterError, match="characters"):
        param_term_parse("param:a=" + "x" * 1001)


def test_filters_by_owner_error_code_and_time_range():
    ann = UserFactory(username="ann")
    mine = make_job(owner=ann)
    broken = make_job()
    Job.objects.filter(id=broken.id).update(last_error_code="TIMEOUT")
    old = make_job()
    Job.objects.filter(id=old.id).update(created_at=datetime(2020, 1, 1, tzinfo=UTC))
    every = Job.objects.all()
    assert list(jobs_filtered(jobs=every, filters=JobFilter(owner="ann"))) == [mine]
    assert list(jobs_filtered(jobs=every, filters=JobFilter(error_code="TIMEOUT"))) == [broken]
    before = JobFilter(created_before=datetime(2021, 1, 1, tzinfo=UTC))
    assert list(jobs_filtered(jobs=every, filters=before)) == [old]
    listed = job_filter_from_list(QueryDict("created_at_from=2019-12-31&created_at_to=2020-01-01"))
    assert list(jobs_filtered(jobs=every, filters=listed)) == [old]


@pytest.mark.parametrize(
    "query",
    [
        "status__exact=nope",
        "queue__exact=nowhere",
        "created_at_from=yesterday",
        "created_at_from=2021-01-02&created_at_to=2021-01-01",
        "project=3",
        "q=0190",
        "error_code=" + "E" * 65,
    ],
)
def test_list_filters_a_cancel_cannot_carry_are_refused(query):
    with pytest.raises(JobFilterError):
        job_filter_from_list(QueryDict(query))


def test_the_portal_list_searches_params_and_errors_for_limited_staff_stay_in_their_org():
    mine_org, other_org = OrganisationFactory(), OrganisationFactory()
    ours, theirs = _sim(7), _sim(7)
    Job.objects.filter(id=ours.id).update(org=mine_org, last_error_code="BOOM")
    Job.objects.filter(id=theirs.id).update(org=other_org, last_error_code="BOOM")
    bea = role_user("operator", username="bea")
    OperatorScope.objects.create(user=bea).organisations.add(mine_org)
    page = otp_login(Client(), bea).get("/admin/jobs/job/", {"q": "param:steps=7"})
    assert page.status_code == 200
    assert str(ours.id) in page.content.decode() and str(theirs.id) not in page.content.decode()
    by_code = otp_login(Client(), bea).get("/admin/jobs/job/", {"error_code": "BOOM"})
    assert str(ours.id) in by_code.content.decode()
    assert str(theirs.id) not in by_code.content.decode()
    bad = otp_login(Client(), bea).get("/admin/jobs/job/", {"q": "param:steps"})
    assert "Nothing searched: A params search reads param:key=value" in bad.content.decode()
