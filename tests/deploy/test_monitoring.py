"""The alert rules and the Grafana dashboard in deploy/ parse and only use real metrics.

A PromQL parser (promql-parser, the Rust parser Prometheus-compatible databases use)
stands in for `promtool check rules`, which is a Go binary this project does not ship.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import django_prometheus.db.metrics  # noqa: F401  (its database backend's django_db_*)
import promql_parser
import pytest
import yaml
from prometheus_client import REGISTRY

import jobs.integrations.metrics  # noqa: F401  (registers the metrics of docs/operations/observability.md)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
DASHBOARD = json.loads((DEPLOY / "grafana" / "jobops.json").read_text())
# Series another exporter provides (RabbitMQ's built-in rabbitmq_prometheus plugin).
EXTERNAL_PREFIXES = ("rabbitmq_",)
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _series_we_export() -> set[str]:
    names = set()
    for family in REGISTRY.collect():
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def _metric_names(node: object) -> Iterator[str]:
    """Every metric name a parsed PromQL expression selects."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node.name
        return
    if isinstance(node, promql_parser.MatrixSelector):
        yield from _metric_names(node.vector_selector)
        return
    for attr in ("lhs", "rhs", "expr"):
        if hasattr(node, attr):
            yield from _metric_names(getattr(node, attr))
    for arg in getattr(node, "args", None) or ():
        yield from _metric_names(arg)


def _check_expr(expr: str) -> set[str]:
    names = set(_metric_names(promql_parser.parse(expr)))
    assert names, f"selects no metric: {expr}"
    unknown = {n for n in names - _series_we_export() if not n.startswith(EXTERNAL_PREFIXES)}
    assert not unknown, f"{expr!r} uses metrics nothing exports: {sorted(unknown)}"
    return names


RULE_LIST = [rule for group in RULES["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("rule", RULE_LIST, ids=[r["alert"] for r in RULE_LIST])
def test_each_alert_rule_parses_and_has_a_runbook(rule):
    assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
    _check_expr(rule["expr"])
    assert rule["labels"]["severity"] in {"info", "warning", "critical"}
    assert rule["for"][-1] in "smh" and int(rule["for"][:-1]) > 0
    assert rule["annotations"]["summary"].strip()
    runbook = rule["annotations"]["runbook"].strip()
    assert runbook and "\n" not in runbook  # one line an on-call reads at 3 a.m.


def test_alerts_cover_what_on_call_must_hear_about():
    used = set().union(*(_check_expr(r["expr"]) for r in RULE_LIST))
    for metric in (
        "dlq_depth",  # DLQ growing
        "job_oldest_pending_age_seconds",  # stuck in pending
        "job_stale_locks",  # stuck in running
        "live_workers",  # worker heartbeat missing
        "live_dispatchers",  # dispatcher heartbeat missing
        "audit_checkpoint_age_seconds",  # checkpoint too old
        "jobs_failed_total",  # jobs failing for good
        "erp_events_parked",  # refused ERP events waiting (PostgreSQL alone)
        "dispatcher_step_failing",  # a dispatcher step that keeps raising
        "dispatcher_step_failures_total",
    ):
        assert metric in used, metric
    assert len({r["alert"] for r in RULE_LIST}) == len(RULE_LIST)


def test_the_dashboard_panels_query_real_metrics():
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    used: set[str] = set()
    for panel in DASHBOARD["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used |= _check_expr(target["expr"])
    for metric in (
        "rabbitmq_detailed_queue_messages",  # queue depths
        "dlq_depth",
        "job_create_total",  # rates by type
        "retries_total",  # retry distribution by error code
        "job_duration_seconds_bucket",  # duration percentiles
        "dlq_replay_total",  # replay outcomes
        "job_oldest_pending_age_seconds",
        "outbox_lag_seconds",
        "jobs_succeeded_total",  # success and failure rates
        "jobs_failed_total",
        "jobs_dead_lettered_total",
        "job_queue_latency_seconds_bucket",  # latency percentiles
        "job_attempts_bucket",
        "rate_limited_total",
        "external_call_duration_seconds_bucket",
        "connector_state",  # breaker state
        "dispatcher_step_failures_total",  # a dispatcher step that raises
        "django_db_execute_total",  # the database backend's
    ):
        assert metric in used, metric


def test_a_misspelt_metric_is_caught():
    with pytest.raises(AssertionError, match="job_create_totl"):
        _check_expr("rate(job_create_totl[5m])")
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (queue (dlq_depth)")


def test_a_failing_dispatcher_step_alerts_by_step_for_any_step():
    rule = next(r for r in RULE_LIST if r["alert"] == "JobopsDispatcherStepFailing")
    parsed = promql_parser.parse(rule["expr"])
    # Both sides keep the `step` label (the summary names it) and nothing else: one
    # alert per failing step, whatever its error class.
    for side in (parsed.lhs, parsed.rhs):
        aggregate = side.lhs if hasattr(side, "lhs") else side
        assert list(aggregate.modifier.labels) == ["step"], rule["expr"]
    assert "{{ $labels.step }}" in rule["annotations"]["summary"]
    # No step is named: a new step is covered without a new rule.
    assert "step=" not in rule["expr"]
