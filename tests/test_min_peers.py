"""``training.min_peers``: a fresh node takes no local step until it sees that many alive peers
(as DDP's ranks wait for each other), or ``training.min_peers_wait`` has passed. Real daemons on
loopback with the stub worker; the step counter and status are the node's own."""

from __future__ import annotations

import time

import pytest

from nodes import STUB, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.timeout(90)
def test_a_node_waits_for_its_peers_then_trains(cluster) -> None:
    want = ["--set", "training.min_peers=2"]
    a = cluster("a", extra=[*STUB, *want])
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["waiting_for_peers"] == [0, 2], 20, "a to wait for its peers")
    time.sleep(2.0)  # the stub takes a step every few milliseconds when let
    assert a.status()["training"]["step"] == 0
    b = cluster("b", seeds=[a.addr], extra=[*STUB, *want])
    wait_for(lambda: a.status()["training"]["waiting_for_peers"] == [1, 2], 20, "a to see b")
    time.sleep(1.0)
    assert a.status()["training"]["step"] == 0 and b.status()["training"]["step"] == 0
    c = cluster("c", seeds=[a.addr], extra=[*STUB, *want])
    for n in (a, b, c):
        wait_for(lambda n=n: n.status()["training"]["step"] > 0, 30, f"{n.name} to train")
        assert n.status()["training"]["waiting_for_peers"] is None


@pytest.mark.timeout(60)
def test_a_node_alone_starts_once_the_wait_is_over(cluster) -> None:
    a = cluster("a", extra=[*STUB, "--set", "training.min_peers=3", "--set", "training.min_peers_wait=2"])
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["step"] > 0, 30, "a to start alone")
    assert a.status()["training"]["waiting_for_peers"] is None
    assert "training starts with 0 of the 3 peers" in a.log()
