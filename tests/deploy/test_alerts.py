"""deploy/: the alerting rules pass ``promtool check rules`` and their unit tests
(``promtool test rules``), every alert has unit tests that make it fire and
keep it quiet, the dashboard's queries parse, and every metric the rules and
the dashboard read is one a real ingress's /metrics exports.

promtool comes from Debian's ``prometheus`` package; scripts/test installs it
(scripts/lib.sh, ``ensure_promtool``). A missing promtool fails these tests,
as an unreachable PostgreSQL fails its own: nothing here is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from models.db import session_scope
from models.inbox import DeliveryStatus
from models.tables import CatchUpRun, IngressHeartbeat, WebhookSource, utcnow
from tests.support.metrics import post, scraped
from tests.support.stores import Store

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "taskhook-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "taskhook-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "taskhook.json"
RUNBOOK = ROOT / "docs" / "runbook.md"

#: Labels Prometheus adds to every series it scrapes: not taskhook's own.
TARGET_LABELS = {"instance", "job"}
#: Grafana's variables in the dashboard's queries, and what they stand for
#: when the queries are checked.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}

METRIC = re.compile(r"\btaskhook_[a-z0-9_]+\b")
SELECTOR = re.compile(r"\b(taskhook_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def promtool() -> str:
    found = shutil.which(os.environ.get("PROMTOOL", "promtool"))
    if found is None:
        pytest.fail(
            "promtool is not installed: scripts/test installs it (Debian's prometheus "
            "package: apt-get install --no-install-recommends prometheus), or set PROMTOOL "
            "to its path"
        )
    return found


def run_promtool(*args: str | Path) -> str:
    done = subprocess.run(
        [promtool(), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    output = f"$ promtool {' '.join(map(str, args))}\n{done.stdout}{done.stderr}"
    assert done.returncode == 0, output
    return output


def rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def dashboard_queries() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    return [
        target["expr"]
        for panel in document["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]


def all_queries() -> list[str]:
    return [rule["expr"] for rule in rules()] + dashboard_queries()


# --- promtool ------------------------------------------------------------------------------


def test_the_rules_pass_promtool_check_rules():
    assert "SUCCESS" in run_promtool("check", "rules", RULES)


def test_the_rules_pass_their_unit_tests():
    assert "SUCCESS" in run_promtool("test", "rules", RULE_TESTS)


def test_the_dashboard_queries_parse(tmp_path: Path):
    """promtool parses each query as a recording rule's (Grafana's variables
    replaced by durations)."""
    recorded = []
    for number, query in enumerate(dashboard_queries()):
        for variable, duration in GRAFANA_VARIABLES.items():
            query = query.replace(variable, duration)
        assert "$" not in query, query
        recorded.append({"record": f"taskhook:dashboard_query_{number}", "expr": query})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    assert "SUCCESS" in run_promtool("check", "rules", path)


# --- the rules and their tests, side by side ----------------------------------------------


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_keeps_it_quiet():
    fired: set[str] = set()
    quiet: set[str] = set()
    document = yaml.safe_load(RULE_TESTS.read_text())
    assert document["rule_files"] == [RULES.name]
    for group in document["tests"]:
        for case in group.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = set(alerts())
    assert names, "no alerts in the rules file"
    assert names - fired == set(), "alerts no test case fires"
    assert names - quiet == set(), "alerts no test case expects quiet"
    assert (fired | quiet) - names == set(), "test cases of alerts the rules do not have"


def test_every_alert_says_its_severity_what_and_where_the_runbook_is():
    headings = {
        _anchor(line.lstrip("#"))
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("#")
    }
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "docs/runbook.md", name
        assert anchor == name.lower(), name
        assert anchor in headings, f"docs/runbook.md has no heading for {name}"


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


# --- the metrics they read are the ingress's own -----------------------------------------


def exported(store: Store, ingress) -> dict:
    """The metric families of a real ingress's /metrics, each with samples: after
    a delivery, a forged one, a redelivery with another body, a catch-up run,
    and an hour no ingress was up."""
    now = utcnow()
    with session_scope(store.sessions) as session:
        source = session.scalar(select(WebhookSource).where(WebhookSource.slug == "acme-github"))
        session.add(
            IngressHeartbeat(
                host="h",
                pid=1,
                started_at=now - timedelta(hours=3),
                last_seen_at=now - timedelta(hours=2),
            )
        )
        session.add(
            CatchUpRun(
                source_id=source.id,
                since=now - timedelta(hours=1),
                covered_until=now - timedelta(minutes=1),
                dry_run=False,
                missed=1,
                recovered=1,
            )
        )
    with ingress(metrics_source_labels=True) as client:
        assert post(client, "github", "issues__opened", delivery="d-1").status_code == 202
        assert post(client, "github", "pull_request__opened", delivery="d-1").status_code == 202
        assert post(client, "github", "issues__opened", secret="forged").status_code == 401
        families = scraped(client)
    assert [name for name, family in families.items() if not family.samples] == []
    return families


#: The sample names a family of each type exports besides its own name.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
    "summary": ("", "_count", "_sum", "_created"),
}


def test_every_metric_the_rules_and_the_dashboard_read_is_exported(sourced: Store, ingress):
    families = exported(sourced, ingress)
    names = {
        family.name + suffix for family in families.values() for suffix in SUFFIXES[family.type]
    }
    labels: dict[str, set[str]] = {}
    values: dict[tuple[str, str], set[str]] = {}
    for family in families.values():
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
            for label, label_value in sample.labels.items():
                values.setdefault((sample.name, label), set()).add(label_value)

    queries = all_queries()
    used = {name for query in queries for name in METRIC.findall(query)}
    assert used - names == set(), "metrics /metrics does not export"
    for query in queries:
        metrics = METRIC.findall(query)
        assert metrics, f"no taskhook metric in {query!r}"
        for name, matchers in SELECTOR.findall(query):
            for label, wanted in MATCHER.findall(matchers):
                assert label in labels.get(name, set()), f"{name} has no label {label}"
                if label == "status":
                    assert wanted in {status.value for status in DeliveryStatus}, query
                    assert wanted in values[(name, label)], f"{name} never says {wanted}"
        for grouping in GROUPING.findall(query):
            for label in filter(None, (part.strip() for part in grouping.split(","))):
                for name in metrics:
                    have = labels.get(name, set()) | TARGET_LABELS
                    assert label in have, f"{name} has no label {label} ({query!r})"


def test_the_exported_metrics_pass_promtool_check_metrics(sourced: Store, ingress):
    with ingress(metrics_source_labels=True) as client:
        assert post(client, "github", "issues__opened").status_code == 202
        text = client.get("/metrics").text
    done = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_grafana_json_on_a_prometheus_datasource_variable():
    document = json.loads(DASHBOARD.read_text())
    assert document["uid"] == "taskhook"
    (variable,) = document["templating"]["list"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    panels = document["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    titles = {panel["title"] for panel in panels if panel["type"] != "row"}
    for wanted in (
        "Deliveries by result",
        "Ingress latency",
        "Backlog age",
        "Inbox by status",
        "Relay published / dropped",
        "Signature failures",
        "Since the last catch-up",
    ):
        assert wanted in titles
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${" + variable["name"] + "}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
