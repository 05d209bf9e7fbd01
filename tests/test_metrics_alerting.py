"""Metrics an operator can alert on, without a daemon: every known label value is there at 0
from the start (and the lists of known values cover every literal the code counts), accuracy is
NaN until measured, no ``_created`` series, build info and process metrics, and the diverging
gauge turns on when the worker keeps restoring and off again once it stops."""

from __future__ import annotations

import math
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from p2pnode import __version__
from p2pnode.daemon import metrics
from p2pnode.daemon.metrics import DIVERGING_LOSSES, DIVERGING_WINDOW, NodeMetrics

SRC = Path(metrics.__file__).resolve().parents[1]


def values(m: NodeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_fresh_node_exports_every_label_at_zero_and_nan_accuracy() -> None:
    v = values(NodeMetrics())
    for result in metrics.EXCHANGE_RESULTS:
        assert v[("p2pnode_exchanges_total", (("result", result),))] == 0
    for reason in metrics.REJECT_REASONS:
        assert v[("p2pnode_payloads_rejected_total", (("reason", reason),))] == 0
    assert v[("p2pnode_members", (("state", "alive"),))] == 0
    assert math.isnan(v[("p2pnode_test_accuracy_ratio", ())])
    assert not any(name.endswith("_created") for name, _ in v)
    assert any(name == "p2pnode_build_info" and dict(lab)["version"] == __version__ for name, lab in v)
    assert v[("p2pnode_process_resident_memory_bytes", ())] > 0
    assert v[("p2pnode_training_diverging", ())] == 0
    assert not any(name.startswith("p2pnode_membership_members") for name, _ in v)


def literals(pattern: str) -> set[str]:
    found = set()
    for path in SRC.rglob("*.py"):
        found |= set(re.findall(pattern, path.read_text()))
    return found


def test_known_label_lists_cover_what_the_code_counts() -> None:
    results = literals(r'exchanges\.labels\("([\w-]+)"\)') | literals(r'_failed\(peer, rec, "([\w-]+)"')
    results |= literals(r'"timeout" if isinstance\(exc, PeerTimeout\) else "([\w-]+)"')
    assert results and results <= set(metrics.EXCHANGE_RESULTS), results - set(metrics.EXCHANGE_RESULTS)
    reasons = literals(r'rejected\.labels\("([\w-]+)"\)') | literals(r'on_reject\("([\w-]+)"\)')
    reasons |= literals(r'refuse\(\d+, "([\w-]+)"') | literals(r'BodyRefused\(\d+, "([\w-]+)"')
    assert reasons and reasons <= set(metrics.REJECT_REASONS), reasons - set(metrics.REJECT_REASONS)


def test_diverging_turns_on_and_off() -> None:
    m = NodeMetrics()
    gauge = lambda: values(m)[("p2pnode_training_diverging", ())]  # noqa: E731
    m.note_nonfinite(DIVERGING_LOSSES - 1, now=100.0)
    assert gauge() == 0
    m.note_nonfinite(1, now=110.0)
    assert gauge() == 1 and values(m)[("p2pnode_training_nonfinite_losses_total", ())] == DIVERGING_LOSSES
    m.note_nonfinite(0, now=100.0 + DIVERGING_WINDOW + 1)  # the first nine are out of the window
    assert gauge() == 0
