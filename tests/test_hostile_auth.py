"""Authentication in both directions, against real daemons sharing a secret: a captured signed
request played again gets 401; every answer to a signed request carries a signature bound to
that request; a model answer altered on the way (an aiohttp man in the middle flipping one bit)
is refused by the node that pulled it and never reaches its worker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon_util import http_request
from fake_peer import FakePeer
from nodes import STUB, NodeProc, wait_for

from p2pnode.net.auth import (
    HEADER_SIG,
    ReplayCache,
    sign,
    sign_response,
    verify_response,
)

SECRET = b"both ways"


def signed_json(addr: str, path: str) -> dict[str, Any]:
    status, _, body = http_request(addr, "GET", path, secret=SECRET)
    assert status == 200, (status, body[:200])
    return json.loads(body)


def ready(node: NodeProc) -> dict[str, Any]:
    return wait_for(lambda: (s := signed_json(node.addr, "/v1/status"))["training"]["worker_alive"]
                    and s["joined"] and s, 40, f"{node.name} to be ready")



def test_replay_cache_refuses_a_signature_twice_and_stays_bounded() -> None:
    cache = ReplayCache(max_skew=300, max_entries=3, born=0)
    assert cache.fresh("a", 1000, now=1000) and not cache.fresh("a", 1000, now=1001)
    for i, sig in enumerate("bcd"):
        assert cache.fresh(sig, 1001 + i, now=1001)
    assert len(cache) == 3 and cache.floor == 1000  # "a" evicted: its second and older refused
    assert not cache.fresh("a", 1000, now=1002) and not cache.fresh("z", 999, now=1002)
    assert cache.fresh("e", 1005, now=1005)
    assert cache.fresh("f", 3000, now=3000) and len(cache) == 1  # the rest expired


def test_replay_cache_refuses_requests_stamped_before_it_was_made() -> None:
    cache = ReplayCache(born=1000.5)  # START_SKEW = 1 s: a stamp before 999.5 is refused
    assert not cache.fresh("a", 999, now=1001) and not cache.fresh("b", 900, now=1001)
    assert cache.fresh("c", 1000, now=1001) and cache.fresh("d", 1001, now=1001)
    old = ReplayCache(born=1000.0)  # 999 = born - 1 s: not before it, taken
    assert not old.fresh("e", 998, now=1000) and old.fresh("f", 999, now=1000)


def test_a_signed_request_captured_before_a_restart_gets_401_after_it(cluster: Callable[..., NodeProc]) -> None:
    """The replay cache lives in memory: a request taken by the node's previous life, played back
    within the 5-minute window right after a restart, is refused all the same (401, "replayed")
    because it was stamped before the node (re)started; a fresh request is taken."""
    node = cluster("a", extra=[*STUB, "--set", f"node.secret={SECRET.decode()}"])
    ready(node)
    captured = [("GET", "/v1/status", sign(SECRET, "GET", "/v1/status", b"")),
                ("GET", "/v1/model", sign(SECRET, "GET", "/v1/model", b""))]
    for method, path, headers in captured:
        assert http_request(node.addr, method, path, headers=headers)[0] == 200, path
    assert node.stop() == 0
    stamped = max(int(h["X-P2P-Timestamp"]) for _, _, h in captured)
    while time.time() < stamped + 2.5:  # the restart's own start-up takes longer: make sure of it
        time.sleep(0.1)
    node.start()
    ready(node)
    for method, path, headers in captured:
        status, _, reply = http_request(node.addr, method, path, headers=headers)
        assert status == 401 and b"replayed" in reply, (path, status, reply)
        # never seen by this life, inside the 5-minute window: only its stamp gives it away
        assert abs(time.time() - int(headers["X-P2P-Timestamp"])) < 300
    assert http_request(node.addr, "GET", "/v1/status", secret=SECRET)[0] == 200


def test_a_replayed_signed_request_gets_401(cluster: Callable[..., NodeProc]) -> None:
    # pushes from anyone holding the secret: "x" is no member of this lone node, and a push from
    # a non-member is refused (403) before its signature is checked
    node = cluster("a", extra=[*STUB, "--set", f"node.secret={SECRET.decode()}", "--set", "exchange.accept_pushes=any"])
    ready(node)
    for method, path, body in [("GET", "/v1/status", b""), ("GET", "/v1/model", b""),
                               ("POST", "/v1/model?from=x", b"\x80")]:
        captured = sign(SECRET, method, path, body)
        first, headers, _ = http_request(node.addr, method, path, body, headers=captured)
        assert first != 401, (method, path, first)
        replayed, _, reply = http_request(node.addr, method, path, body, headers=captured)
        assert replayed == 401 and b"replayed" in reply, (method, path, replayed, reply)


def test_answers_to_signed_requests_are_signed_and_bound_to_the_request(cluster: Callable[..., NodeProc]) -> None:
    node = cluster("a", extra=[*STUB, "--set", f"node.secret={SECRET.decode()}"])
    ready(node)
    for path in ["/v1/model", "/v1/model?since=abc", "/v1/status", "/no/such/path"]:
        request = sign(SECRET, "GET", path, b"")
        status, headers, body = http_request(node.addr, "GET", path, headers=request)
        assert verify_response(SECRET, request[HEADER_SIG], status, body, headers | {
            "X-P2P-Response-Signature": headers.get("x-p2p-response-signature", "")}), (path, status)
        # the same answer presented for another request, or altered, does not verify
        other = sign(SECRET, "GET", path, b"")[HEADER_SIG]
        sig = headers["x-p2p-response-signature"]
        assert sig != sign_response(SECRET, other, status, body)
        assert sig != sign_response(SECRET, request[HEADER_SIG], status, body + b"x")


def test_a_tampered_model_answer_is_refused(cluster: Callable[..., NodeProc],
                                            fake_peer: Callable[[str], FakePeer], tmp_path: Path) -> None:
    fake = fake_peer("tamper")
    common = [*STUB, "--set", f"node.secret={SECRET.decode()}", "--set", "exchange.every=1",
              "--set", "exchange.sync=none"]  # gossip's fetch is what is tampered with
    victim = cluster("victim", extra=common)
    ready(victim)
    evil = cluster("evil", seeds=[victim.addr], extra=[*common, "--advertise", fake.addr])
    fake.backend = evil.addr
    evil_id = ready(evil)["node_id"]

    def refused() -> dict[str, Any] | None:
        rec = signed_json(victim.addr, "/v1/status")["peers"].get(evil_id)
        return rec if rec and rec["failed"] >= 2 else None

    rec = wait_for(refused, 40, "the victim to refuse tampered answers")
    assert fake.tampered >= 2
    assert "not signed" in rec["last_error"], rec
    assert rec["bytes_received"] == 0, rec  # no altered payload reached the worker
