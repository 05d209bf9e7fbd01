"""64 clients polling a real daemon flat out from one address (127.0.0.2): beyond the per-source
rate they get 429 (with Retry-After), while the node keeps exchanging with its real peer on
another address (127.0.0.1) and answers its health check."""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from daemon_util import http_request, metrics_text, sample_value

from nodes import STUB, NodeProc, get_json, wait_for

ATTACKER = "127.0.0.2"
PATHS = ["/v1/status", "/metrics", "/v1/model?since=0"]


def poll(addr: str, seconds: float, statuses: Counter[int], retry_after: list[str], lock: threading.Lock) -> None:
    """One poller: keep-alive requests one after another for ``seconds``, counting statuses."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(ATTACKER, 0))
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        try:
            conn.request("GET", PATHS[i % len(PATHS)])
            resp = conn.getresponse()
            resp.read()
            with lock:
                statuses[resp.status] += 1
                if resp.status == 429 and not retry_after:
                    retry_after.append(resp.getheader("Retry-After") or "")
        except (OSError, http.client.HTTPException):
            with lock:
                statuses[0] += 1
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(ATTACKER, 0))
        i += 1
    conn.close()


def exchanges_with(node: NodeProc, peer_id: str) -> dict[str, Any]:
    return get_json(node.addr)["peers"].get(peer_id, {"ok": 0, "failed": 0, "left_out": False})


def test_64_pollers_get_429_and_the_node_keeps_serving_its_peer(cluster: Callable[..., NodeProc]) -> None:
    victim = cluster("victim", extra=[*STUB])
    victim_id = victim.wait_ready()["node_id"]
    peer = cluster("peer", seeds=[victim.addr], extra=[*STUB])
    peer_id = peer.wait_ready()["node_id"]
    wait_for(lambda: exchanges_with(peer, victim_id)["ok"] >= 3, 30, "the peer to exchange with the victim")
    before_peer = exchanges_with(peer, victim_id)
    before_victim = exchanges_with(victim, peer_id)

    statuses: Counter[int] = Counter()
    retry_after: list[str] = []
    lock = threading.Lock()
    threads = [threading.Thread(target=poll, args=(victim.addr, 5.0, statuses, retry_after, lock))
               for _ in range(64)]
    for t in threads:
        t.start()
    try:
        time.sleep(2.0)
        health = http_request(victim.addr, "GET", "/healthz")[0]
        during_peer = exchanges_with(peer, victim_id)
    finally:
        for t in threads:
            t.join(60)
    after_peer = exchanges_with(peer, victim_id)
    after_victim = exchanges_with(victim, peer_id)

    assert statuses[429] > 0, statuses
    assert statuses[200] > 0, statuses  # the allowed rate is still served
    assert retry_after and retry_after[0].isdigit(), retry_after
    assert health == 200
    # the real peer, on its own address, kept fetching from the victim through the flood, and
    # the victim from it; neither left the other out
    assert during_peer["ok"] > before_peer["ok"], (before_peer, during_peer)
    assert after_peer["ok"] > during_peer["ok"], (during_peer, after_peer)
    assert after_victim["ok"] > before_victim["ok"], (before_victim, after_victim)
    assert not after_peer["left_out"] and not after_victim["left_out"]
    assert sample_value(metrics_text(victim.addr), "p2pnode_payloads_rejected_total",
                        {"reason": "rate-limited"}) >= statuses[429]


def test_full_snapshots_have_their_own_rate_per_address(cluster: Callable[..., NodeProc]) -> None:
    victim = cluster("victim", extra=[*STUB, "--set", "http.snapshot_rate_per_source=0.1",
                                      "--set", "http.snapshot_burst=5"])
    victim.wait_ready()
    host, port = victim.addr.rsplit(":", 1)
    got: list[int] = []
    for _ in range(8):
        conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(ATTACKER, 0))
        conn.request("GET", "/v1/model")
        got.append(conn.getresponse().status)
        conn.close()
    assert got[:5] == [200] * 5 and 429 in got[5:], got
    # deltas and 304s are not snapshots: another address is not affected either
    assert http_request(victim.addr, "GET", "/v1/model")[0] == 200
