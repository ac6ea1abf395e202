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

from jobs.integrations import metrics  # registers the metrics of docs/operations/observability.md

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
        "audit_future_partitions",  # fewer than two months of audit partitions ahead
        "audit_partitions_ready_to_detach",  # an archived partition waits for its detach
        "jobs_failed_total",  # jobs failing for good
        "erp_events_parked",  # refused ERP events waiting (PostgreSQL alone)
        "dispatcher_step_failing",  # a dispatcher step that keeps raising
        "dispatcher_step_failures_total",
        "webhook_endpoints_disabled_total",  # an organisation's receiver given up on
        "audit_verification_last_success_timestamp_seconds",  # full walk too old
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
        "job_create_total",  # creations by outcome
        "jobs_enqueued_total",  # enqueued and started by queue
        "jobs_started_total",
        "retries_total",  # retry distribution by error code
        "jobs_duration_seconds_bucket",  # duration percentiles
        "dlq_replay_total",  # replay outcomes
        "job_oldest_pending_age_seconds",
        "outbox_lag_seconds",
        "jobs_succeeded_total",  # success and failure rates
        "jobs_failed_total",
        "deadletter_total",
        "job_queue_latency_seconds_bucket",  # latency percentiles
        "jobs_attempts_bucket",
        "rate_limited_total",
        "external_call_duration_seconds_bucket",
        "connector_state",  # breaker state
        "dispatcher_step_failures_total",  # a dispatcher step that raises
        "django_db_execute_total",  # the database backend's
        "s3_operation_duration_seconds_bucket",  # the artefact storage on S3
        "s3_operation_errors_total",
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


# --- labels, and the names deprecated for one release -------------------------------------
def _label_names() -> dict[str, set[str]]:
    """Each series name we export -> the labels its samples carry (a bucket's `le` too)."""
    found: dict[str, set[str]] = {}
    for name, collector in REGISTRY._names_to_collectors.items():
        labels = set(getattr(collector, "_labelnames", ()))
        found[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return found


def _labels_used(node: object, inside: frozenset[str] = frozenset()) -> Iterator[tuple[str, str]]:
    """(metric, label) for each label an expression groups by or matches on, paired with
    each metric selected beneath it."""
    if isinstance(node, promql_parser.VectorSelector):
        for matcher in node.matchers.matchers:
            yield node.name, matcher.name
        return
    if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
        if node.modifier.type == promql_parser.AggModifierType.By:
            for metric in set(_metric_names(node.expr)):
                for label in node.modifier.labels:
                    yield metric, label
    for attr in ("lhs", "rhs", "expr", "vector_selector"):
        if hasattr(node, attr):
            yield from _labels_used(getattr(node, attr))
    for arg in getattr(node, "args", None) or ():
        yield from _labels_used(arg)


def _deploy_exprs() -> list[str]:
    dashboard = [t["expr"] for panel in DASHBOARD["panels"] for t in panel["targets"]]
    return [rule["expr"] for rule in RULE_LIST] + dashboard


def test_every_label_a_query_groups_by_or_matches_is_one_its_metric_carries():
    labels = _label_names()
    for expr in _deploy_exprs():
        for metric, label in _labels_used(promql_parser.parse(expr)):
            if not metric.startswith(EXTERNAL_PREFIXES):
                assert label in labels[metric], f"{expr!r}: {metric} has no label {label}"
    with pytest.raises(AssertionError, match="has no label type"):
        for metric, label in _labels_used(promql_parser.parse("sum by (type) (deadletter_total)")):
            assert label in labels[metric], f"{metric} has no label {label}"


def _deprecated_series() -> set[str]:
    suffixes = ("", "_bucket", "_count", "_sum")
    return {name + suffix for name in metrics.DEPRECATED_NAMES for suffix in suffixes}


def test_the_dashboard_and_alerts_use_no_deprecated_name_or_label():
    deprecated = _deprecated_series()
    for expr in _deploy_exprs():
        parsed = promql_parser.parse(expr)
        assert not set(_metric_names(parsed)) & deprecated, expr
        for metric, label in _labels_used(parsed):
            assert label not in metrics.DEPRECATED_LABELS.get(metric, ()), expr


def test_the_deprecated_names_are_exported_until_the_release_that_removes_them():
    def release(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("."))

    pyproject = (DEPLOY.parent / "pyproject.toml").read_text()
    version = next(
        line.split('"')[1] for line in pyproject.splitlines() if line.startswith("version =")
    )
    exported = _label_names()
    still_here = {n for n in _deprecated_series() if n in exported}
    still_labelled = {
        (name, label)
        for name, gone in metrics.DEPRECATED_LABELS.items()
        for label in gone
        if label in exported[name]
    }
    if release(version) >= release(metrics.DEPRECATED_REMOVED_IN):
        # This release removes them (docs/operations/upgrading.md#metric-names).
        assert not still_here and not still_labelled
    else:  # both sets, one release, as the upgrade notes promise
        assert set(metrics.DEPRECATED_NAMES) <= still_here
        assert len(still_labelled) == sum(len(gone) for gone in metrics.DEPRECATED_LABELS.values())
