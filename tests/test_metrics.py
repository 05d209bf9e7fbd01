"""/metrics follows Prometheus conventions (p2pnode_ prefix, base units, counters in _total) and
parses with prometheus_client's own parser; ``p2pnode status`` prints a readable block."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nodes import STUB, free_port, wait_for
from daemon_util import metrics_text
from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.membership.swim.metrics import SwimMetrics

#: unit suffixes that are not base units (Prometheus wants seconds, bytes, ratios)
NOT_BASE_UNITS = re.compile(r"_(milli|micro|nano)?(ms|us|ns|msec|millis|minutes|hours|kb|mb|gb|kib|mib|percent)(_|$)")


def check_conventions(text: str) -> dict[str, object]:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families
    for name, fam in families.items():
        assert name.startswith("p2pnode_"), name
        assert not NOT_BASE_UNITS.search(name), f"{name}: not in base units"
        assert fam.documentation, f"{name}: no help text"
        for s in fam.samples:
            assert s.name.startswith("p2pnode_"), s.name
            if fam.type == "counter":
                assert s.name.endswith(("_total", "_created")), f"counter sample {s.name} lacks _total"
                if s.name.endswith("_total"):
                    assert s.value >= 0, s
        if fam.type == "counter":
            assert any(s.name == name + "_total" for s in fam.samples) or not fam.samples, name
    return families


def test_every_metric_follows_the_conventions() -> None:
    """All names, labels included, without a daemon: NodeMetrics plus SWIM's."""
    m = NodeMetrics()
    SwimMetrics(m.registry)
    for reason in ("malformed", "too-large", "unauthorized"):
        m.rejected.labels(reason).inc()
    m.exchanges.labels("ok").inc()
    m.requests_served.labels("delta").inc()
    m.exchange_seconds.observe(0.01)
    families = check_conventions(generate_latest(m.registry).decode())
    assert families["p2pnode_exchange_duration_seconds"].type == "histogram"
    assert families["p2pnode_payloads_rejected"].type == "counter"


def test_a_bad_exposition_fails_the_check() -> None:
    """The checker itself can fail."""
    with pytest.raises(AssertionError):
        check_conventions("# HELP steps_total x\n# TYPE steps_total counter\nsteps_total 1\n")
    with pytest.raises(AssertionError):
        check_conventions("# HELP p2pnode_latency_ms x\n# TYPE p2pnode_latency_ms gauge\np2pnode_latency_ms 1\n")


@pytest.mark.timeout(90)
def test_metrics_and_status_of_a_running_cluster(cluster) -> None:
    a = cluster("a", extra=STUB)
    b = cluster("b", seeds=[a.addr], extra=STUB)
    ids = {n.name: n.wait_ready()["node_id"] for n in (a, b)}
    for n in (a, b):
        wait_for(lambda n=n: n.status()["exchanges"]["done"] >= 3, 30, f"{n.name} to exchange")

    for n in (a, b):
        families = check_conventions(metrics_text(n.addr))
        hist = families["p2pnode_exchange_duration_seconds"]
        assert hist.type == "histogram"
        buckets = [(s.labels["le"], s.value) for s in hist.samples if s.name.endswith("_bucket")]
        count = next(s.value for s in hist.samples if s.name.endswith("_count"))
        total = next(s.value for s in hist.samples if s.name.endswith("_sum"))
        values = [v for _, v in buckets]
        assert values == sorted(values) and buckets[-1] == ("+Inf", count)
        assert count >= 3 and total > 0
        for name in ("p2pnode_training_steps", "p2pnode_exchanges", "p2pnode_model_served_bytes",
                     "p2pnode_worker_restarts", "p2pnode_checkpoints", "p2pnode_payloads_rejected"):
            assert families[name].type == "counter", name
        ok = [s.value for s in families["p2pnode_exchanges"].samples
              if s.name == "p2pnode_exchanges_total" and s.labels.get("result") == "ok"]
        assert ok and ok[0] >= 3
        # p2pnode_members is sampled once a second: give it that long to see the second node.
        wait_for(lambda n=n: [s.value for f in text_string_to_metric_families(metrics_text(n.addr))
                              if f.name == "p2pnode_members" for s in f.samples
                              if s.labels.get("state") == "alive"] == [2.0], 5, f"{n.name}'s members gauge")

    # The CLI's status: a readable block with the node id and its members.
    run = subprocess.run([sys.executable, "-m", "p2pnode", "status", a.addr], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert ids["a"] in out.splitlines()[0] and a.addr in out.splitlines()[0]
    assert "members:" in out
    member_lines = out.split("members:", 1)[1].strip().splitlines()
    assert len(member_lines) == 2 and all("alive" in line for line in member_lines), out
    assert any(ids["b"] in line and b.addr in line for line in member_lines), out
    assert any(ids["a"] in line and "(this node)" in line for line in member_lines), out
    assert "training" in out and "step" in out
    run = subprocess.run([sys.executable, "-m", "p2pnode", "status", a.addr, "--json"], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 0 and json.loads(run.stdout)["node_id"] == ids["a"]
    run = subprocess.run([sys.executable, "-m", "p2pnode", "status", f"127.0.0.1:{free_port()}", "--timeout", "2"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 1 and "no status from" in run.stderr
