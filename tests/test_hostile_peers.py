"""Peers that waste a node's time, played by an aiohttp fake peer in front of a real daemon.

The fake peer is a real stub daemon advertised at a proxy's address: membership traffic passes
through to the daemon (so the victim verifies and keeps it as a member), but ``GET /v1/model``
gets the attack: "nothing new" (304) or "not ready" (503) after 1.9 s of a 2 s exchange
timeout, or a redirect to a third party. The victim must leave the slow peer out and never
follow the redirect (the third party gets no request at all)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_peer import FakePeer
from nodes import STUB, NodeProc, get_json, wait_for


def record(node: NodeProc, peer_id: str) -> dict[str, Any]:
    return get_json(node.addr)["peers"].get(peer_id, {"ok": 0, "failed": 0, "left_out": False, "last_error": ""})


def start_pair(cluster: Callable[..., NodeProc], fake: FakePeer) -> tuple[NodeProc, str]:
    """The victim, and the evil daemon behind ``fake`` (advertised at the proxy's address)."""
    timings = ["--set", "exchange.timeout=2.0", "--set", "exchange.every=1"]
    victim = cluster("victim", extra=[*STUB, *timings])
    victim.wait_ready()
    evil = cluster("evil", seeds=[victim.addr], extra=[*STUB, *timings, "--advertise", fake.addr])
    fake.backend = evil.addr
    evil_id = evil.wait_ready()["node_id"]
    wait_for(lambda: any(m["node_id"] == evil_id and m["state"] == "alive" for m in get_json(victim.addr)["members"]),
             30, "the victim to see the evil peer alive")
    return victim, evil_id


@pytest.mark.parametrize("attack", ["slow-304", "slow-503"])
def test_a_peer_answering_nothing_just_before_the_timeout_is_left_out(
        cluster: Callable[..., NodeProc], fake_peer: Callable[[str], FakePeer], tmp_path: Path, attack: str) -> None:
    fake = fake_peer(attack)
    victim, evil_id = start_pair(cluster, fake)
    # three slow answers in a row (fail_threshold) and the victim leaves the peer out
    rec = wait_for(lambda: (r := record(victim, evil_id))["left_out"] and r, 40, "the slow peer to be left out")
    assert rec["failed"] >= 3 and rec["ok"] == 0, rec
    assert "deadline" in rec["last_error"], rec


def test_a_redirect_is_not_followed(cluster: Callable[..., NodeProc], fake_peer: Callable[[str], FakePeer]) -> None:
    fake = fake_peer("redirect")
    victim, evil_id = start_pair(cluster, fake)
    rec = wait_for(lambda: (r := record(victim, evil_id))["failed"] >= 3 and r, 40, "redirects to count as failures")
    assert "302" in rec["last_error"], rec
    assert fake.model_gets >= 3
    assert fake.third_party_hits == 0
