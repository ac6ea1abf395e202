"""prometheus_client's multiprocess directory: made at start, pruned of earlier runs, and
never a reason for a process to stop (core/metrics_dir.py, config/gunicorn_conf.py)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from config import gunicorn_conf
from core.metrics_dir import ENV, multiprocess_dir_ready
from tests.processes import run_manage, subprocess_env


def test_it_creates_the_missing_directory_and_its_parents(tmp_path, monkeypatch):
    directory = tmp_path / "var" / "prometheus" / "dispatcher"
    monkeypatch.setenv(ENV, str(directory))
    assert multiprocess_dir_ready() == str(directory)
    assert directory.is_dir()
    assert multiprocess_dir_ready() == str(directory)  # a second call finds it there


def test_an_unusable_directory_is_a_warning_and_metrics_stay_in_the_process(
    tmp_path, monkeypatch, json_log_lines
):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(ENV, str(tmp_path / "a-file" / "prometheus"))
    assert multiprocess_dir_ready() is None
    # Unset, so prometheus_client (imported later) keeps values in memory.
    assert ENV not in os.environ
    (line,) = [x for x in json_log_lines() if x["event"] == "metrics_multiproc_dir_unusable"]
    assert line["level"] == "warning" and "NotADirectoryError" in line["error"]


def test_an_empty_value_counts_as_unset(monkeypatch):
    monkeypatch.setenv(ENV, "")
    assert multiprocess_dir_ready() is None
    assert ENV not in os.environ


@pytest.mark.django_db(transaction=True)
def test_a_dispatcher_starts_without_its_metrics_directory(tmp_path):
    directory = tmp_path / "var" / "prometheus" / "dispatcher"
    done = run_manage("run_dispatcher", "--once", env=subprocess_env(**{ENV: str(directory)}))
    # It crashed with "Duplicated timeseries in CollectorRegistry" when the directory
    # was missing; now it makes it and writes its values there.
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(directory.glob("counter_*.db"))


def test_gunicorn_drops_the_files_of_an_earlier_run_when_it_starts(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    stale = [tmp_path / "counter_999999.db", tmp_path / "gauge_livesum_999999.db"]
    mine = tmp_path / f"counter_{os.getpid()}.db"
    for path in (*stale, mine):
        path.write_bytes(b"")
    gunicorn_conf.on_starting(SimpleNamespace())
    assert [p.exists() for p in stale] == [False, False]
    assert mine.exists()  # the master's own values


def test_a_gunicorn_worker_that_exits_stops_counting_in_live_gauges(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    live = tmp_path / "gauge_livesum_4242.db"
    counter = tmp_path / "counter_4242.db"
    live.write_bytes(b"")
    counter.write_bytes(b"")
    gunicorn_conf.child_exit(SimpleNamespace(), SimpleNamespace(pid=4242))
    assert not live.exists()
    assert counter.exists()  # what it counted stays counted
