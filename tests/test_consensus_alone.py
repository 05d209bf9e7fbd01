"""The consensus finish's verdict when a node has nobody to measure against: alone (no alive
peer) it agrees; with alive peers whose exchanges all fail (left out) it has agreed with nobody
and must not say it has (exchange/consensus.py)."""

from __future__ import annotations

import math

from p2pnode.exchange.consensus import CONSENSUS_WINDOW, STALE_AFTER, STALL_AFTER_S, ConsensusFinish
from p2pnode.daemon.metrics import NodeMetrics


def test_alone_agrees_but_peers_all_left_out_is_not_agreement() -> None:
    finish = ConsensusFinish(0.01, NodeMetrics())
    assert finish.status(done=True, peers=0, distances=[])["reached"]  # nobody alive: alone
    left = finish.status(done=True, peers=0, distances=[], left_out=2)
    assert not left["reached"] and left["left_out"] == 2 and left["max_distance"] is None
    assert not finish.status(done=False, peers=0, distances=[])["reached"]  # still training
    # a full window within tolerance does not stand for peers none of which answers now
    for _ in range(CONSENSUS_WINDOW):
        finish.averaged(0.001)
    assert not finish.status(done=True, peers=0, distances=[], left_out=1)["reached"]
    assert finish.status(done=True, peers=1, distances=[0.002], left_out=1)["reached"]
    assert not finish.status(done=True, peers=1, distances=[0.5])["reached"]  # one still far off
    assert math.isclose(finish.metrics.registry.get_sample_value("p2pnode_consensus_distance_ratio") or 0.0, 0.5)


def test_a_peer_no_longer_measured_stops_holding_agreement_off() -> None:
    """Nodes started apart: the graph gave the first node a peer while the others joined and then
    other peers; that peer's last distance (over the tolerance) is never measured again. It
    counts while it is recent, not after STALE_AFTER averages with the peers it meets now."""
    finish = ConsensusFinish(0.01, NodeMetrics())
    finish.averaged(0.023, "early")
    for i in range(CONSENSUS_WINDOW):
        finish.averaged(0.0, "a" if i % 2 else "b")
    distances = {"early": 0.023, "a": 0.0, "b": 0.0}
    assert not finish.status(done=True, peers=3, distances=distances)["reached"]  # still recent: it counts
    for i in range(STALE_AFTER):
        finish.averaged(0.0, "a" if i % 2 else "b")
    status = finish.status(done=True, peers=3, distances=distances)
    assert status["reached"] and status["max_distance"] == 0.0
    finish.averaged(0.023, "early")  # measured again, and still far: it counts again
    finish.averaged(0.0, "a")
    assert not finish.status(done=True, peers=3, distances=distances)["reached"]


def test_a_finish_that_cannot_agree_ends_after_stall_after_seconds() -> None:
    """Peers whose guard refused their merge keep their own, different, models and average no
    more: a node averaging with them stays over the tolerance for good. STALL_AFTER_S after
    training ended its finish ends all the same ("stalled"), so the daemon asks the worker's guard
    once and slows to the gentle pace instead of the quick one for ever."""
    now = [100.0]
    finish = ConsensusFinish(0.01, NodeMetrics(), clock=lambda: now[0])
    distances = {"a": 0.05, "b": 0.07}
    assert not finish.status(done=False, peers=2, distances=distances)["reached"]
    now[0] += 1000.0  # training time does not count
    for i in range(2 * CONSENSUS_WINDOW):
        finish.averaged(0.05 if i % 2 else 0.07, "a" if i % 2 else "b")
    status = finish.status(done=True, peers=2, distances=distances)  # training ended now
    assert not status["reached"] and not status["stalled"]
    now[0] += STALL_AFTER_S - 1
    assert not finish.status(done=True, peers=2, distances=distances)["reached"]
    now[0] += 1
    status = finish.status(done=True, peers=2, distances=distances)
    assert status["reached"] and status["stalled"] and status["max_distance"] == 0.07
