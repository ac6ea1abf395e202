"""Oversized request lines and headers: answered by Django in the envelope (414, 431),
with gunicorn's own limits above Django's so that it is Django that answers."""

from __future__ import annotations

import runpy
import shlex
import socket

import pytest
import requests
from django.conf import settings as django_settings
from rest_framework.authtoken.models import Token

from tests.e2e.live_api import GUNICORN_CONFIG, gunicorn_server
from tests.factories import UserFactory, client_for, otp_login, role_user
from tests.processes import ROOT

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs"


def _error(response) -> dict:
    assert response["Content-Type"] == "application/json", response.content[:200]
    return response.json()["error"]


def test_a_5000_character_cursor_is_414_in_the_envelope_with_the_request_id(client):
    response = client.get(f"{JOBS}?cursor={'a' * 5000}", HTTP_X_REQUEST_ID="req-414")
    assert response.status_code == 414
    error = _error(response)
    assert error["code"] == "ERR-HTTP-414"
    assert error["message"] == (
        "The request URI is 5020 characters long; at most 4096 are accepted."
    )
    assert error["details"] == {"limit": 4096, "size": 5020}
    assert response["X-Request-ID"] == "req-414"


def test_a_uri_at_the_limit_reaches_the_view(settings):
    api = client_for(UserFactory())
    path = f"{JOBS}?cursor="
    response = api.get(path + "a" * (settings.JOBOPS_MAX_URI_CHARS - len(path)))
    assert response.status_code == 400  # the view's answer: an invalid cursor
    assert _error(response)["details"] == {
        "cursor": ["Invalid cursor: longer than 200 characters."]
    }


def test_a_header_over_16_kib_is_431_in_the_envelope_naming_it(client):
    response = client.get(JOBS, HTTP_X_PADDING="x" * 20_000)
    assert response.status_code == 431
    error = _error(response)
    assert error["code"] == "ERR-HTTP-431"
    assert error["message"] == (
        "The X-Padding header is 20011 bytes long; at most 16384 are accepted."
    )
    assert error["details"] == {"header": "X-Padding", "limit": 16384, "size": 20011}


def test_more_than_100_headers_is_431(client):
    sent = {key for key in client.get(JOBS).wsgi_request.META if key.startswith("HTTP_")}
    fill = 100 - len(sent)  # the test client's own (Cookie) count too
    many = {f"HTTP_X_H{i}": "1" for i in range(fill)}
    assert client.get(JOBS, **many).status_code == 401  # 100: served as usual
    response = client.get(JOBS, **many, HTTP_X_ONE_MORE="1")
    assert response.status_code == 431
    assert _error(response)["details"] == {"limit": 100, "size": 101}


def test_a_10_kb_header_and_a_long_cookie_are_served_as_usual():
    api = client_for(UserFactory())
    assert api.get(JOBS, HTTP_X_PADDING="x" * 10_240).status_code == 200
    portal = otp_login(api.__class__(), role_user("viewer"))
    portal.cookies["tracking"] = "c" * 12_000  # SSO and analytics cookies add up
    assert portal.get("/admin/jobs/job/").status_code == 200


def test_the_portal_gets_a_plain_431_not_json(client):
    response = client.get("/admin/", HTTP_X_PADDING="x" * 20_000)
    assert response.status_code == 431
    assert response["Content-Type"].startswith("text/plain")
    assert b"at most 16384" in response.content


def test_a_chunked_body_is_411_in_the_envelope_never_read_as_empty(client):
    api = client_for(UserFactory())
    body = b'{"type": "sim", "params": {"steps": 1}}'
    response = api.generic(
        "POST", JOBS, body, content_type="application/json", HTTP_TRANSFER_ENCODING="chunked"
    )
    assert response.status_code == 411
    error = _error(response)
    assert error["code"] == "ERR-HTTP-411"
    assert "Content-Length" in error["message"]
    assert error["details"] == {"transfer_encoding": "chunked"}
    assert response["X-Request-ID"]
    portal = client.generic("POST", "/admin/login/", b"x=1", HTTP_TRANSFER_ENCODING="chunked")
    assert portal.status_code == 411 and portal["Content-Type"].startswith("text/plain")


@pytest.fixture(scope="module")
def live(django_db_setup, django_db_blocker):
    """One gunicorn for the module's live tests (each boot costs seconds)."""
    with django_db_blocker.unblock(), gunicorn_server(workers=1, threads=2) as base:
        yield base


@pytest.mark.django_db(transaction=True)
def test_live_gunicorn_answers_a_chunked_create_411_and_a_sized_one_201(live):
    """Under gunicorn a chunked body reaches Django de-chunked but without a
    Content-Length; before the 411 it was read as empty ("type" required, a 400)."""
    token = Token.objects.create(user=UserFactory()).key
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    body = b'{"type": "sim", "params": {"steps": 1, "step_seconds": 0}}'
    chunked = requests.post(f"{live}{JOBS}", data=iter([body]), headers=headers, timeout=10)
    assert chunked.request.headers["Transfer-Encoding"] == "chunked"
    assert chunked.status_code == 411, chunked.text
    assert chunked.json()["error"]["code"] == "ERR-HTTP-411"
    # A negative Content-Length never reaches Django: gunicorn's parser refuses it
    # with its own HTML page, which gunicorn has no setting to change.
    host, port = live.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {JOBS} HTTP/1.1\r\nHost: {host}\r\nContent-Length: -1\r\n\r\n".encode())
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"Content-Type: text/html" in answer
    sized = requests.post(f"{live}{JOBS}", data=body, headers=headers, timeout=10)
    assert sized.status_code == 201, sized.text


def test_gunicorn_runs_with_limits_above_djangos_from_the_procfile_config(monkeypatch):
    web = next(
        line for line in (ROOT / "Procfile").read_text().splitlines() if line.startswith("web:")
    )
    argv = shlex.split(web)
    assert argv[argv.index("--config") + 1] == GUNICORN_CONFIG  # the live tests' config
    path = ROOT / (GUNICORN_CONFIG.removeprefix("python:").replace(".", "/") + ".py")
    config = runpy.run_path(str(path))
    # "GET " + URI + " HTTP/1.1" must fit gunicorn's request line.
    assert config["limit_request_line"] >= django_settings.JOBOPS_MAX_URI_CHARS + 20
    assert config["limit_request_field_size"] > django_settings.JOBOPS_MAX_HEADER_BYTES
    assert config["limit_request_fields"] > django_settings.JOBOPS_MAX_HEADERS
    # A deployment that raises Django's limits raises gunicorn's with them.
    monkeypatch.setenv("JOBOPS_MAX_HEADER_BYTES", "65536")
    monkeypatch.setenv("JOBOPS_MAX_HEADERS", "300")
    raised = runpy.run_path(str(path))
    assert (raised["limit_request_field_size"], raised["limit_request_fields"]) == (131072, 600)


@pytest.mark.django_db(transaction=True)
def test_live_gunicorn_answers_a_long_cursor_and_big_headers_in_the_envelope(live):
    cursor = requests.get(f"{live}{JOBS}?cursor={'a' * 5000}", timeout=10)
    assert cursor.status_code == 414
    assert cursor.json()["error"]["code"] == "ERR-HTTP-414"
    assert cursor.headers["X-Request-ID"]

    ten_kb = requests.get(f"{live}{JOBS}", headers={"X-Padding": "x" * 10_240}, timeout=10)
    assert ten_kb.status_code == 401  # served as usual: no credentials
    assert ten_kb.json()["error"]["code"] == "ERR-AUTH-401"

    twenty_kb = requests.get(f"{live}{JOBS}", headers={"X-Padding": "x" * 20_000}, timeout=10)
    assert twenty_kb.status_code == 431
    assert twenty_kb.json()["error"]["code"] == "ERR-HTTP-431"

    # Past gunicorn's own limit (twice Django's) gunicorn answers, as documented.
    huge = requests.get(f"{live}{JOBS}", headers={"X-Padding": "x" * 40_000}, timeout=10)
    assert huge.status_code in (400, 431)
    assert "application/json" not in huge.headers.get("Content-Type", "")
