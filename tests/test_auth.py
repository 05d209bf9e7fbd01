"""The shared cluster secret: HMAC signing (unit tests of p2pnode.net.auth) and real daemons that
sign, check, refuse strangers, and keep /healthz and /metrics open."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import msgpack
import pytest
from daemon_util import declared_post, http_request, metrics_text, sample_value
from nodes import STUB, wait_for

from p2pnode.net.auth import HEADER_NONCE, HEADER_SIG, HEADER_TS, sign, verify

SECRET = b"correct horse battery staple"


# --- p2pnode.net.auth --------------------------------------------------------------------

def test_sign_then_verify() -> None:
    headers = sign(SECRET, "post", "/v1/model?from=abc", b"payload")
    assert set(headers) == {HEADER_SIG, HEADER_TS, HEADER_NONCE}
    assert verify(SECRET, "POST", "/v1/model?from=abc", b"payload", headers)
    assert verify(SECRET, "post", "/v1/model?from=abc", b"payload", headers)  # method case does not matter


@pytest.mark.parametrize("change", ["body", "path", "query", "method", "secret", "signature", "timestamp"])
def test_any_change_breaks_the_signature(change: str) -> None:
    method, path, body, secret = "POST", "/v1/model?from=abc", b"payload", SECRET
    headers = sign(secret, method, path, body)
    if change == "body":
        body = b"payloaD"
    elif change == "path":
        path = "/v1/status?from=abc"
    elif change == "query":
        path = "/v1/model?from=abd"
    elif change == "method":
        method = "GET"
    elif change == "secret":
        secret = b"another secret"
    elif change == "signature":
        sig = headers[HEADER_SIG]
        headers[HEADER_SIG] = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    else:  # the timestamp is signed too: moving it (within the skew) breaks the signature
        headers[HEADER_TS] = str(int(headers[HEADER_TS]) + 1)
    assert not verify(secret, method, path, body, headers)


def test_stale_and_future_timestamps_are_refused() -> None:
    now = 1_800_000_000
    headers = sign(SECRET, "GET", "/v1/status", b"", ts=now)
    assert verify(SECRET, "GET", "/v1/status", b"", headers, now=now + 299)
    assert not verify(SECRET, "GET", "/v1/status", b"", headers, now=now + 301)  # replayed later
    assert not verify(SECRET, "GET", "/v1/status", b"", headers, now=now - 301)  # from the future
    assert verify(SECRET, "GET", "/v1/status", b"", headers, max_skew=10, now=now + 5)
    assert not verify(SECRET, "GET", "/v1/status", b"", headers, max_skew=10, now=now + 11)
    # the default clock is the real one
    assert not verify(SECRET, "GET", "/v1/status", b"", sign(SECRET, "GET", "/v1/status", b"", ts=now))
    assert verify(SECRET, "GET", "/v1/status", b"", sign(SECRET, "GET", "/v1/status", b""))


@pytest.mark.parametrize("headers", [{}, {HEADER_SIG: "00"}, {HEADER_TS: "1"}, {HEADER_TS: "soon", HEADER_SIG: "00"},
                                     {HEADER_TS: "", HEADER_SIG: ""}])
def test_missing_or_garbled_headers_are_refused(headers: dict[str, str]) -> None:
    assert not verify(SECRET, "GET", "/v1/status", b"", headers)


# --- real daemons ------------------------------------------------------------------------

def signed_json(addr: str, path: str, secret: bytes = SECRET) -> dict:
    status, _, body = http_request(addr, "GET", path, secret=secret)
    assert status == 200, (path, status, body[:200])
    return json.loads(body)


def oversized_post(addr: str, limit: int, headers: dict[str, str], peer: str = "x") -> int:
    """Declare a body over the limit and send almost none of it: the answer must not wait for it."""
    return declared_post(addr, f"/v1/model?from={peer}", limit + 1, headers)


@pytest.mark.timeout(90)
def test_secret_cluster_signs_checks_and_refuses_strangers(cluster) -> None:
    limit = 4 * 1024 * 1024
    # gossip named: "auto" with a secret would pick the synchronous mode, which exchanges no models
    same = [*STUB, "--set", f"node.secret={SECRET.decode()}", "--set", f"http.max_request_bytes={limit}",
            "--set", "exchange.sync=none"]
    a = cluster("a", extra=same)
    b = cluster("b", seeds=[a.addr], extra=same)
    stranger = cluster("c", seeds=[a.addr], extra=[*STUB, "--set", "node.secret=another secret"])

    def ready(n) -> dict | None:
        s = signed_json(n.addr, "/v1/status")
        return s if s["training"]["worker_alive"] and s["joined"] else None

    ids = {n.name: wait_for(lambda n=n: ready(n), 40, f"{n.name} to be ready")["node_id"] for n in (a, b)}
    # a and b, sharing the secret, see each other and exchange models.
    for n in (a, b):
        wait_for(lambda n=n: {m["node_id"] for m in signed_json(n.addr, "/v1/status")["members"]
                              if m["state"] == "alive"} == set(ids.values()), 15, f"{n.name} to see both")
        wait_for(lambda n=n: signed_json(n.addr, "/v1/status")["exchanges"]["done"] >= 2, 30,
                 f"{n.name} to exchange")

    # The node with another secret cannot join: no seed answers it, it gives up (exit 1), and
    # nobody ever lists it. (Waited for first, so that its knocking does not skew the counts below.)
    assert stranger.proc.wait(40) == 1
    assert "no seed answered" in stranger.log()
    assert "did not stop cleanly" not in stranger.log(), stranger.log()  # the worker was told, not killed
    for n in (a, b):
        members = signed_json(n.addr, "/v1/status")["members"]
        assert {m["node_id"] for m in members} == set(ids.values()), members

    # Unsigned, stale or badly signed requests get 401 on everything but /healthz and /metrics.
    counts = metrics_text(a.addr)
    # (pushes name b, a member on loopback as this test is: a push from a non-member would get
    # 403 from its headers, before its signature is checked)
    push = f"/v1/model?from={ids['b']}"
    for method, path in (("GET", "/v1/model"), ("GET", "/v1/status"), ("GET", "/v1/model?since=0"),
                         ("POST", push), ("POST", "/v1/membership/push-pull")):
        body = msgpack.packb({"node_id": "x", "addr": "127.0.0.1:1", "incarnation": 0}) if method == "POST" else b""
        status, _, reply = http_request(a.addr, method, path, body)
        assert status == 401, (method, path, status, reply[:200])
        status, _, _ = http_request(a.addr, method, path, body, secret=b"another secret")
        assert status == 401, (method, path, "wrong secret", status)
    stale = sign(SECRET, "GET", "/v1/status", b"", ts=int(time.time()) - 3600)
    assert http_request(a.addr, "GET", "/v1/status", headers=stale)[0] == 401
    replayed = sign(SECRET, "GET", "/v1/status", b"")  # a valid signature, for another path
    assert http_request(a.addr, "GET", "/v1/model", headers=replayed)[0] == 401
    tampered = sign(SECRET, "POST", push, b"one body")
    assert http_request(a.addr, "POST", push, b"another", headers=tampered)[0] == 401
    # Requests are refused from their headers, before the body is read: no signature (401),
    # or a body declared over the limit (413).
    assert oversized_post(a.addr, limit, {}) == 401
    assert oversized_post(a.addr, limit, sign(SECRET, "POST", push, b""), peer=ids["b"]) == 413
    # A signed push (the secret proves the cluster) naming no member is still refused: 403.
    stranger_push = sign(SECRET, "POST", "/v1/model?from=x", b"\x80")
    assert http_request(a.addr, "POST", "/v1/model?from=x", b"\x80", headers=stranger_push)[0] == 403
    for path in ("/healthz", "/metrics"):
        assert http_request(a.addr, "GET", path)[0] == 200, path
    # The CLI signs its status request when given the secret, and is refused without it.
    secret_file = a.state_dir.parent / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    cli = [sys.executable, "-m", "p2pnode", "status", a.addr]
    ok = subprocess.run([*cli, "--secret-file", str(secret_file)], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and ids["a"] in ok.stdout, ok.stderr
    assert subprocess.run(cli, capture_output=True, text=True, timeout=30).returncode == 1
    after = metrics_text(a.addr)
    for reason, n in (("unauthorized", 14 + 1), ("too-large", 1)):  # + the unsigned CLI request
        got = (sample_value(after, "p2pnode_payloads_rejected_total", {"reason": reason})
               - sample_value(counts, "p2pnode_payloads_rejected_total", {"reason": reason}))
        assert got == n, (reason, got)
