"""``compression.publish_on = "fetch"``: a node's public copy moves when a peer fetches it (at most
once a step), not every ``publish_every`` steps, so the peer averages in the model as it is now.
Real daemons on loopback with the stub worker; versions read from the node's own answers."""

from __future__ import annotations

import time

import pytest
from daemon_util import fetch_snapshot, http_request, metrics_text, sample_value

from nodes import STUB, wait_for

pytestmark = pytest.mark.slow

FETCH = [*STUB, "--set", "compression.publish_on=fetch"]


def published(addr: str) -> float:
    return sample_value(metrics_text(addr), "p2pnode_published_version")


@pytest.mark.timeout(90)
def test_a_fetch_is_answered_with_a_fresh_publish_and_nothing_else_publishes(cluster) -> None:
    # publish_every far out: the fallback (a copy nobody fetched for 4 x publish_every steps is
    # published anyway) stays out of this test's few hundred steps. accept_pushes = any (a closed
    # network): the test's own client, a stranger, may ask for fresh publishes
    a = cluster("a", extra=[*FETCH, "--set", "compression.publish_every=100000", "--set", "exchange.accept_pushes=any"])
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["step"] > 50, 30, "a to train")
    assert published(a.addr) == 0  # fifty steps and more, nobody asked: nothing published
    _, snap, first = fetch_snapshot(a.addr)
    versions = [int(first)]
    for _ in range(2):
        before = a.status()["training"]["step"]
        wait_for(lambda before=before: a.status()["training"]["step"] > before, 10, "a step")
        status, headers, body = http_request(a.addr, "GET", f"/v1/model?since={versions[-1]}&epoch={snap.header.epoch}")
        assert status == 200 and headers["x-p2p-kind"] == "delta", (status, headers)
        versions.append(int(headers["x-p2p-version"]))
    assert versions == [1, 2, 3], versions  # each fetch got a publish of its own, made for it
    time.sleep(1.0)  # the stub steps every few ms: with publish_every = 4 that would be ~100 versions
    assert published(a.addr) == 3


@pytest.mark.timeout(90)
def test_only_a_members_fetch_makes_the_node_publish(cluster) -> None:
    far = ["--set", "compression.publish_every=100000"]  # no fallback publishes in this test
    a = cluster("a", extra=[*FETCH, *far])
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["step"] > 50, 30, "a to train")
    for who in ("", "&from=0123456789abcdef"):  # no name, and a name that is no member's
        status, headers, _ = http_request(a.addr, "GET", f"/v1/model?since=0{who}")
        # answered from the copy there is: the start's snapshot, version 0 (nothing published)
        assert status == 200 and headers["x-p2p-version"] == "0", (status, headers)
    assert published(a.addr) == 0
    # b exchanges with a, naming itself (?from=, from its own host): a publishes for each such fetch
    b = cluster("b", seeds=[a.addr], extra=[*STUB, *far])
    b.wait_ready()
    wait_for(lambda: published(a.addr) >= 3 and b.status()["exchanges"]["done"] >= 3, 30, "b's fetches to make a publish")


@pytest.mark.timeout(60)
def test_a_copy_nobody_fetches_is_still_published_now_and_then(cluster) -> None:
    a = cluster("a", extra=[*FETCH, "--set", "compression.publish_every=10"])
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["step"] > 200, 30, "a to train")
    steps, versions = a.status()["training"]["step"], published(a.addr)
    assert 0 < versions <= steps // 40 + 1, (steps, versions)  # once every 4 x 10 unfetched steps


@pytest.mark.timeout(120)
def test_two_nodes_publishing_on_fetch_train_and_agree(cluster) -> None:
    end = ["--set", "training.max_samples=12800"]  # 200 steps of the stub
    a = cluster("a", extra=[*FETCH, *end])
    a.wait_ready()
    b = cluster("b", seeds=[a.addr], extra=[*FETCH, *end])
    for n in (a, b):
        wait_for(lambda n=n: (s := n.status())["training"]["done"] and s["consensus"]["reached"], 90,
                 f"{n.name} to finish and agree")
        assert n.status()["exchanges"]["done"] > 0
