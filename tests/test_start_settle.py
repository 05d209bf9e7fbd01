"""``training.start_settle`` (the default gate before a fresh node's first step, with
``training.min_peers`` unset): a node waits until membership has stopped growing for the window,
so nodes started within it of each other start together; one joining a cluster that trains
already starts at once. Real daemons on loopback with the stub worker (tests/nodes.py turns the
window off; these tests set a short one)."""

from __future__ import annotations

import time

import pytest

from nodes import STUB, wait_for

pytestmark = pytest.mark.slow

WINDOW = ["--set", "training.start_settle=6"]


def first_steps(nodes: list, limit: float) -> dict[str, float]:
    """When each node was first seen with a step (monotonic seconds), polling every 0.1 s."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + limit
    while len(seen) < len(nodes) and time.monotonic() < deadline:
        for n in nodes:
            if n.name not in seen and n.status()["training"]["step"] > 0:
                seen[n.name] = time.monotonic()
        time.sleep(0.1)
    assert len(seen) == len(nodes), f"not all trained within {limit} s: {seen}"
    return seen


@pytest.mark.timeout(120)
def test_a_node_joining_within_the_window_starts_with_the_first(cluster) -> None:
    a = cluster("a", extra=[*STUB, *WINDOW])
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["settling"] is not None, 20, "a to wait for membership to settle")
    time.sleep(2.0)  # the stub takes a step every few milliseconds when let
    assert a.status()["training"]["step"] == 0
    b = cluster("b", seeds=[a.addr], extra=[*STUB, *WINDOW])
    b.wait_ready()
    wait_for(lambda: a.status()["training"]["settling"] is not None and a.status()["training"]["settling"][0] == 1,
             20, "a to see b")
    # a has been up longer than its window: b's join started it again, and neither has stepped
    assert a.status()["training"]["step"] == 0 and b.status()["training"]["step"] == 0
    seen = first_steps([a, b], 40)
    assert abs(seen["a"] - seen["b"]) < 2.5, seen  # together, not a window apart
    for n in (a, b):
        assert n.status()["training"]["settling"] is None
    assert "1 peer(s) joined" in a.log()

    # a late joiner (the cluster trains already) does not wait out its window
    c = cluster("c", seeds=[a.addr], extra=[*STUB, "--set", "training.start_settle=60"])
    c.wait_ready()
    wait_for(lambda: c.status()["training"]["step"] > 0, 30, "c to start at once, its peers training")
    assert "a peer is training already: starting now" in c.log()


@pytest.mark.timeout(90)
def test_a_resumed_node_does_not_wait(cluster) -> None:
    a = cluster("a", extra=[*STUB, "--set", "training.start_settle=2"])
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["step"] > 0, 30, "a to start alone once the window is over")
    assert "membership settled (0 alive" in a.log()
    wait_for(lambda: (a.state_dir / "checkpoint.stub").exists(), 20, "a checkpoint")
    a.stop()
    a.args = [*a.args, "--set", "training.start_settle=60"]
    a.start()
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["step"] > 0, 20, "a to resume at once, without a window")
    assert a.status()["training"]["resumed"]
    assert a.log().count("waiting for membership to settle") == 1
