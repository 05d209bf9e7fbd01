"""The consensus finish's verdict when a node has nobody to measure against: alone (no alive
peer) it agrees; with alive peers whose exchanges all fail (left out) it has agreed with nobody
and must not say it has (daemon/consensus.py)."""

from __future__ import annotations

import math

from p2pnode.daemon.consensus import CONSENSUS_WINDOW, ConsensusFinish
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
