"""A node that anyone can talk to says so at start: no cluster secret is one warning; the simple
membership protocol without one is a second, since that protocol takes any member list and any
``leave`` it is sent (docs/MEMBERSHIP.md). SWIM, the default, refuses such claims from strangers,
so it gets only the first. The synchronous mode without one is another: its reducer is the
member with the lowest id, which a stranger could take."""

from __future__ import annotations

from nodes import wait_for

STUB = ["--set", "training.worker=stub"]
SIMPLE_WARNING = "membership.protocol = simple without a secret"
SYNC_WARNING = "exchange.sync = powersgd without a secret"


def test_an_open_node_warns_and_simple_membership_warns_twice(cluster) -> None:
    simple = cluster("simple", extra=[*STUB, "--set", "membership.protocol=simple"])
    swim = cluster("swim", extra=STUB)
    for node in (simple, swim):
        node.wait_ready()
        wait_for(lambda node=node: "no cluster secret" in node.log(), 10, f"{node.name}'s open-node warning")
    assert SIMPLE_WARNING in simple.log()
    assert SIMPLE_WARNING not in swim.log()
    # gossip ("auto" without a secret): no reducer to take, no advice to start together
    assert "mode gossip (exchange.sync = auto)" in swim.log()
    assert SYNC_WARNING not in swim.log() and "training.min_peers = 0" not in swim.log()


def test_the_synchronous_mode_without_a_secret_warns(cluster, tmp_path) -> None:
    sync = ["--set", "exchange.sync=powersgd"]
    secret = tmp_path / "secret"
    secret.write_text("open-node-warnings-secret\n")
    secret.chmod(0o600)
    open_node = cluster("open", extra=[*STUB, *sync])
    closed = cluster("closed", extra=[*STUB, *sync, "--set", f"node.secret_file={secret}"])
    open_node.wait_ready()
    wait_for(lambda: SYNC_WARNING in open_node.log(), 10, "the open node's warning about its reducer")
    # (its status needs the secret: its log says when it listens, and the warnings come right after)
    wait_for(lambda: "listening on" in closed.log(), 40, "the closed node to listen")
    # the default, "auto", with a secret picks the synchronous mode: no reducer warning, but the
    # advice to start together, saying why this node runs that mode
    auto = cluster("auto", extra=[*STUB, "--set", f"node.secret_file={secret}"])
    wait_for(lambda: "listening on" in auto.log(), 40, "the auto node to listen")
    wait_for(lambda: "training.min_peers = 0" in auto.log(), 10, "its advice to start together")
    for node in (open_node, closed, auto):
        node.stop()
    assert SYNC_WARNING not in closed.log() and "no cluster secret" not in closed.log()
    assert "mode powersgd (exchange.sync = auto)" in auto.log() and SYNC_WARNING not in auto.log()
    assert "the synchronous mode (exchange.sync = auto, with a cluster secret) with training.min_peers = 0" in auto.log()
