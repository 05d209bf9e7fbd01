"""Real daemons on loopback (stub workers): fresh nodes built from the same seed never send each
other a snapshot. Each first fetch names the asker's genesis (its x̂ at version 0,
wire/genesis.py) and is answered with the delta from version 0; a node started from another
seed (another version 0) is sent snapshots, as before."""

from __future__ import annotations

import pytest

from daemon_util import http_request, metrics_text, sample_value
from nodes import STUB, wait_for

FRESH = [*STUB, "--set", "membership.bootstrap_from_peer=false", "--set", "training.max_samples=0"]


def served(node, kind: str) -> float:
    return sample_value(metrics_text(node.addr), "p2pnode_model_requests_total", {"kind": kind})


def done(node) -> int:
    return int(node.status()["exchanges"]["done"])


@pytest.mark.timeout(90)
def test_fresh_nodes_of_one_seed_exchange_without_snapshots(cluster) -> None:
    a = cluster("a", extra=FRESH)
    a.wait_ready()
    b = cluster("b", seeds=[a.addr], extra=FRESH)
    b.wait_ready()
    wait_for(lambda: done(a) >= 5 and done(b) >= 5, 40, "5 exchanges each")
    for node in (a, b):
        assert served(node, "snapshot") == 0, node.name
        assert served(node, "delta") + served(node, "chain") >= 4, node.name
        assert node.status()["exchanges"]["resyncs"] == 0
    # another seed, another version 0: its peers' first answers to it are snapshots, and it
    # averages with them all the same
    c = cluster("c", seeds=[a.addr], extra=[*FRESH, "--set", "training.seed=7"])
    c.wait_ready()
    wait_for(lambda: done(c) >= 3, 40, "c's exchanges")
    assert served(a, "snapshot") + served(b, "snapshot") >= 1
    assert c.status()["exchanges"]["resyncs"] == 0


def test_a_malformed_genesis_is_refused(cluster) -> None:
    a = cluster("a", extra=FRESH)
    a.wait_ready()
    for bad in ("XYZ", "ab" * 17, "AB" * 16, "0" * 31):
        status, _, _ = http_request(a.addr, "GET", f"/v1/model?since=0&genesis={bad}")
        assert status == 400, bad
    status, headers, _ = http_request(a.addr, "GET", f"/v1/model?since=0&genesis={'0' * 32}")
    assert status == 200 and headers["x-p2p-kind"] == "snapshot"  # a digest of nobody's version 0
