"""Rounds of several peers, pipelined (``exchange.peers_per_round``, ``exchange.pipeline``):
real daemons on loopback with the stub worker. Every node keeps exchanging with every peer,
deltas stay in step (no resyncs beyond the first snapshot, no failures), and a peer killed
mid-run is left out without stalling the rounds of the others."""

from __future__ import annotations

import signal

import pytest

from nodes import wait_for

# publish_on = steps: this test is about rounds, and the stub worker takes hundreds of steps
# between two fetches of one peer, so a copy published only on fetch jumps from one fetch to the
# next, and robust averaging once refused such a jump as an outlier (a limit of publish_on =
# fetch with a worker far faster than its exchanges: docs/ALGORITHMS.md)
ROUNDS = ["--set", "training.worker=stub", "--set", "exchange.peers_per_round=2", "--set", "exchange.pipeline=true",
          "--set", "compression.publish_on=steps"]


def noticed_gone(status: dict, node_id: str) -> bool:
    """A dead peer is noticed either by a failed exchange with it or by membership (SWIM may
    suspect it before the next round picks it, and a suspect is never picked: then no
    exchange with it ever fails)."""
    if status["peers"][node_id]["consecutive_failures"] >= 1:
        return True
    return any(m["node_id"] == node_id and m["state"] != "alive" for m in status["members"])


@pytest.mark.timeout(120)
def test_two_peers_a_round_pipelined(cluster) -> None:
    a = cluster("a", extra=ROUNDS)
    a.wait_ready()
    b = cluster("b", seeds=[a.addr], extra=ROUNDS)
    c = cluster("c", seeds=[a.addr], extra=ROUNDS)
    nodes = (a, b, c)
    ids = {n.name: n.wait_ready()["node_id"] for n in nodes}

    def ok_with_all(n, at_least: int) -> bool:
        peers = n.status()["peers"]
        return all((peers.get(ids[o.name]) or {}).get("ok", 0) >= at_least for o in nodes if o is not n)

    for n in nodes:
        wait_for(lambda n=n: ok_with_all(n, 8), 60, f"{n.name} to exchange with both peers")
    for n in nodes:
        s = n.status()
        assert s["exchanges"]["resyncs"] == 0, s["exchanges"]
        assert all(p["failed"] == 0 for p in s["peers"].values()), s["peers"]

    c.signal(signal.SIGKILL)
    done = a.status()["exchanges"]["done"]
    wait_for(lambda: noticed_gone(a.status(), ids["c"]), 30, "a to notice c is gone")
    wait_for(lambda: a.status()["exchanges"]["done"] >= done + 10, 30, "a's rounds to go on with b")
