"""A node's worker is SIGKILLed: its replicas of its peers die with it. The daemon must start
over with them (snapshots), never blame the healthy peer for the replica it no longer has, and
exchange with it again within a few seconds of the restart."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from daemon_util import worker_pid
from nodes import STUB, wait_for

pytestmark = pytest.mark.slow

#: simple membership: there an exchange failure counts towards declaring the peer dead.
#: A long exchange timeout, so that a loaded test machine cannot charge the peer a real
#: timeout; a long publish log, so that the peer still has every version we last fetched and
#: answers our old ``since`` with a delta (the case the old code took for the peer's fault).
#: The torch-free worker (nodes.STUB): it keeps real replicas of its peers (p2pnode.wire.replica)
#: that die with it, as the torch worker's do, and starts again in a fraction of a second.
EXTRA = [*STUB, "--set", "membership.protocol=simple", "--set", "exchange.timeout=10",
         "--set", "compression.log_size=100000"]


def peer_record(status: dict[str, Any], peer_id: str) -> dict[str, Any]:
    return status["peers"].get(peer_id) or {"ok": 0, "failed": 0, "consecutive_failures": 0, "left_out": False}


def assert_not_charged(status: dict[str, Any], peer_id: str) -> dict[str, Any]:
    rec = peer_record(status, peer_id)
    assert rec["failed"] == 0 and rec["consecutive_failures"] == 0 and not rec["left_out"], str(rec)
    states = {m["node_id"]: m["state"] for m in status["members"]}
    assert states.get(peer_id) == "alive", states
    return rec


@pytest.mark.timeout(120)
def test_worker_restart_resyncs_replicas_without_charging_the_peer(cluster) -> None:
    victim = cluster("a", extra=EXTRA)
    victim.wait_ready()
    healthy = cluster("b", seeds=[victim.addr], extra=EXTRA)
    healthy_id = healthy.wait_ready()["node_id"]
    # A few sparse deltas applied to the victim's replica of the healthy peer.
    wait_for(lambda: peer_record(victim.status(), healthy_id)["ok"] >= 4, 40, "exchanges with the peer")
    before = assert_not_charged(victim.status(), healthy_id)

    os.kill(worker_pid(victim.proc.pid), signal.SIGKILL)
    wait_for(lambda: victim.status()["training"]["worker_restarts"] == 1, 20, "the worker's death to be seen")
    # From the kill until well after exchanges resume, the peer is never charged.
    back_at: float | None = None
    resumed_at: float | None = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = victim.status()
        rec = assert_not_charged(s, healthy_id)
        if back_at is None and s["training"]["worker_alive"]:
            back_at, ok_at_restart = time.monotonic(), rec["ok"]
        if back_at is not None and resumed_at is None and rec["ok"] >= ok_at_restart + 3:
            resumed_at = time.monotonic()
        if resumed_at is not None and time.monotonic() - resumed_at > 2.0:
            break
        time.sleep(0.1)
    assert back_at is not None, "the worker never came back"
    assert resumed_at is not None, "exchanges with the peer did not resume"
    # "A few seconds" on a loaded 2-core machine: generous, but a stuck or left-out peer
    # (a 2 s doubling back-off after 3 failures) or a catch-up to the old step would show.
    assert resumed_at - back_at < 15.0, f"exchanges resumed {resumed_at - back_at:.1f} s after the restart"
    after = assert_not_charged(victim.status(), healthy_id)
    assert after["ok"] >= before["ok"] + 3
    # The victim's new worker holds replicas again: sparse deltas (not only snapshots) apply.
    assert victim.status()["exchanges"]["done"] > 0
