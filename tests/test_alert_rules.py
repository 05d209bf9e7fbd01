"""conf/p2pnode-alerts.yml against real nodes: ``promtool check rules`` accepts it, every
selector of every alert matches a series a fresh node exports (no alert sits on "no data"), no
alert fires on a fresh two-node cluster held for 30 minutes of rule time (``promtool test
rules`` over its /metrics), and the same harness does fire an alert when a series says so.
Skipped where promtool (Debian: apt-get install prometheus) is not installed."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon_util import metrics_text
from nodes import STUB, wait_for

RULES = Path(__file__).resolve().parents[1] / "conf" / "p2pnode-alerts.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
DASHBOARD = RULES.with_name("grafana-dashboard.json")

SELECTOR = re.compile(r"\b(p2pnode_\w+|up)(\{([^}]*)\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!=|=)\s*"([^"]*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def alerts() -> dict[str, str]:
    """alert name -> expression, read with promtool's own parser's view (a YAML subset we write)."""
    out, name = {}, None
    lines = RULES.read_text().splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"\s*- alert: (\w+)", line):
            name = m.group(1)
        elif name and (m := re.match(r"\s*expr: (.*)", line)):
            expr = m.group(1)
            if expr.strip() == ">":
                expr = " ".join(x.strip() for x in lines[i + 1:i + 3])
            out[name] = expr
            name = None
    return out


def matches(series: list[tuple[str, dict[str, str], float]], name: str, matchers: str) -> bool:
    for sname, labels, _ in series:
        if sname != name:
            continue
        ok = True
        for key, op, want in MATCHER.findall(matchers or ""):
            have = labels.get(key, "")
            ok &= (have == want) if op == "=" else (have != want) if op == "!=" else bool(re.fullmatch(want, have))
        if ok:
            return True
    return False


def promtool_test(tmp_path: Path, series: list[tuple[str, dict[str, str], float]],
                  expect: dict[str, list[dict[str, object]]]) -> subprocess.CompletedProcess[str]:
    inputs = []
    for name, labels, value in series:
        if math.isnan(value):
            continue  # accuracy before the first evaluation: NaN, no alert reads it
        sel = name + "{" + ",".join(f'{k}={json.dumps(v)}' for k, v in sorted(labels.items())) + "}"
        inputs.append({"series": sel, "values": f"{value!r}+0x40"})
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": inputs,
                      "alert_rule_test": [{"eval_time": "30m", "alertname": a, "exp_alerts": exp}
                                          for a, exp in expect.items()]}]}
    f = tmp_path / "test.yml"
    f.write_text(json.dumps(doc))  # JSON is YAML
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, "test", "rules", str(f)], capture_output=True, text=True, timeout=120)


@needs_promtool
def test_rules_check() -> None:
    proc = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


@needs_promtool
def test_every_alert_evaluates_and_none_fires_on_a_fresh_cluster(cluster, tmp_path: Path) -> None:
    a = cluster("a", extra=STUB)
    a.wait_ready()
    b = cluster("b", seeds=[a.addr], extra=STUB)
    b.wait_ready()
    wait_for(lambda: len([m for m in a.status()["members"] if m["state"] == "alive"]) == 2, 30, "a to see b")
    wait_for(lambda: "p2pnode_members{state=\"alive\"} 2.0" in (text := metrics_text(a.addr)) and text, 10,
             "the members gauge")
    text = metrics_text(a.addr)
    series = [(n, {**lab, "job": "p2pnode", "instance": "a"}, v) for n, lab, v in [*samples(text), ("up", {}, 1.0)]]
    rules = alerts()
    assert len(rules) == RULES.read_text().count("- alert:") >= 8
    for alert, expr in rules.items():
        for name, _, matchers in SELECTOR.findall(expr):
            assert matches(series, name, matchers), f"{alert}: {name}{{{matchers}}} has no series on a fresh node"
    proc = promtool_test(tmp_path, series, {alert: [] for alert in rules})
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # The harness can fail: the same node, but its worker keeps restoring.
    diverging = [(n, lab, 1.0 if n == "p2pnode_training_diverging" else v) for n, lab, v in series]
    fired = [{"exp_labels": {"severity": "page", "job": "p2pnode", "instance": "a"},
              "exp_annotations": {"summary": "p2pnode a: repeated non-finite losses; check training.lr"}}]
    assert promtool_test(tmp_path, diverging, {"P2pnodeTrainingDiverging": fired}).returncode == 0
    assert promtool_test(tmp_path, diverging, {"P2pnodeTrainingDiverging": []}).returncode != 0


def test_grafana_dashboard_reads_only_metrics_that_exist() -> None:
    """Every series the dashboard queries is exported by a node (all label values exist from
    the start), so no panel is empty for want of a name."""
    from prometheus_client import generate_latest

    from p2pnode.daemon.metrics import NodeMetrics
    from p2pnode.membership.swim.metrics import SwimMetrics

    m = NodeMetrics()
    SwimMetrics(m.registry)
    names = {n for n, _, _ in samples(generate_latest(m.registry).decode())}
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        for name, _, _ in SELECTOR.findall(expr):
            assert name in names, f"dashboard queries {name}, which no node exports"
