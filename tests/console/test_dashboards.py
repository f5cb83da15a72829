"""``deploy/``'s Grafana dashboard and Prometheus alert rules are valid and name only metrics a
coordinator exposes (:mod:`fedsketch.server.console.metrics`), and the alerts the issue asks for
are there: coordinator down, store unhealthy, a study stuck past its window, refusal spikes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from fedsketch.server.console.metrics import Metrics, StoreGauges, exposed_names
from fedsketch.server.store import open_store

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\bfedsketch_[a-z0-9_]+")


@pytest.fixture
def exposed(tmp_path) -> set[str]:
    """The series names of a coordinator's registry over a real (empty) SQLite store."""
    store = open_store(tmp_path / "c.db")
    registry = CollectorRegistry()
    Metrics(registry)
    registry.register(StoreGauges(store))
    try:
        return exposed_names(registry)
    finally:
        store.close()


def dashboard_exprs() -> list[str]:
    board = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    assert board["title"] and board["uid"] and board["panels"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    exprs = []
    for panel in board["panels"]:
        assert panel["type"] in ("stat", "timeseries") and panel["title"] and panel["targets"]
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
        exprs += [t["expr"] for t in panel["targets"]]
    return exprs


def alert_rules() -> list[dict]:
    doc = yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    for rule in rules:
        assert rule.keys() >= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"\d+[smh]", rule["for"]) and rule["annotations"]["summary"]
        assert rule["labels"]["severity"] in ("page", "ticket")
    return rules


def test_every_metric_the_dashboard_and_alerts_name_is_exposed(exposed):
    exprs = dashboard_exprs() + [r["expr"] for r in alert_rules()]
    named = {name for e in exprs for name in METRIC.findall(e)}
    assert named, "no fedsketch metric named"
    assert named <= exposed, sorted(named - exposed)
    for e in exprs:  # balanced, as PromQL needs
        assert e.count("(") == e.count(")") and e.count("{") == e.count("}"), e


def test_the_dashboard_shows_every_metric_a_coordinator_exposes(exposed):
    """Nothing exposed is left off the dashboard (a new metric gets a panel)."""
    shown = {n for e in dashboard_exprs() for n in METRIC.findall(e)}
    families = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in exposed}
    missing = {f for f in families if not any(n.startswith(f) for n in shown)}
    assert not missing, sorted(missing)


def test_the_alerts_cover_down_unhealthy_stuck_and_refusal_spikes():
    exprs = {r["alert"]: r["expr"] for r in alert_rules()}
    assert 'up{job="fedsketch-coordinator"} == 0' in exprs["FedsketchCoordinatorDown"]
    assert "fedsketch_store_healthy == 0" in exprs["FedsketchStoreUnhealthy"]
    assert "fedsketch_studies_overdue" in exprs["FedsketchStudyStuck"]
    assert "fedsketch_refusals_total" in exprs["FedsketchRefusalSpike"]
    assert 'code!="OK"' in exprs["FedsketchRpcRefusalSpike"]
