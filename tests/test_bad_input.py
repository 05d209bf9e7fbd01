"""Bad input against a real daemon: every refusal has its status code, is counted in /metrics,
changes nothing in the model, and the daemon and its worker keep running."""

from __future__ import annotations

import http.client
import select
import socket
import time

import msgpack
import numpy as np
import pytest

from nodes import STUB, wait_for
from daemon_util import fetch_snapshot, http_request, metrics_text, pid_alive, sample_value, worker_pid
from p2pnode.wire.codec import encode
from p2pnode.wire.payload import Delta, ModelSpec, Snapshot, TensorSpec

LIMIT = 4 * 1024 * 1024  # far above one snapshot of the model, so only the big bodies hit it
PEER = "feedfacecafebeef"
REJECTED = "p2pnode_payloads_rejected_total"


def post_model(addr: str, body: bytes, peer: str = PEER) -> tuple[int, bytes]:
    status, _, reply = http_request(addr, "POST", f"/v1/model?from={peer}", body,
                                    {"Content-Type": "application/msgpack"})
    return status, reply


def declared_too_large(addr: str) -> int:
    """Declare a body over the limit, send only a few bytes of it: the answer must come at once,
    from the headers alone, before the body is read (let alone decoded)."""
    host, _, port = addr.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5.0)
    try:
        conn.putrequest("POST", f"/v1/model?from={PEER}")
        conn.putheader("Content-Type", "application/msgpack")
        conn.putheader("Content-Length", str(LIMIT + 1))
        conn.endheaders()
        conn.send(b"\x82" * 16)
        return conn.getresponse().status
    finally:
        conn.close()


def chunked_too_large(addr: str, start: bytes) -> int:
    """No Content-Length: the limit must hold while the body streams in. The body starts as a
    real payload (``start``: the guard judges a body's first 64 KiB) and the answer is read as
    soon as it comes: the node cuts the connection of a refused body that goes on streaming."""
    host, _, port = addr.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=5.0)
    try:
        sock.sendall(f"POST /v1/model?from={PEER} HTTP/1.1\r\nHost: {addr}\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        chunks = [start, *(b"\0" * 65536 for _ in range(LIMIT // 65536 + 2))]
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        return int(sock.recv(64).split()[1])
    finally:
        sock.close()


def with_nan(snapshot_bytes: bytes) -> bytes:
    """A valid snapshot (from PEER) whose first tensor holds a NaN; ``encode`` refuses NaN, so
    the msgpack map is edited by hand."""
    obj = msgpack.unpackb(snapshot_bytes, raw=False)
    obj["node"] = PEER
    values = np.frombuffer(obj["data"][0], dtype="<f4").copy()
    values[len(values) // 2] = np.nan
    obj["data"][0] = values.tobytes()
    return msgpack.packb(obj, use_bin_type=True)


@pytest.mark.timeout(90)
def test_bad_payloads_are_refused_counted_and_change_nothing(cluster) -> None:
    # the bodies' handling is the point here, so pushes from anyone (PEER is no member of this lone
    # node; the refusal of non-members is tests/test_hostile_push.py's)
    node = cluster("a", extra=[*STUB, "--set", f"http.max_request_bytes={LIMIT}", "--set", "training.max_samples=64",
                               "--set", "exchange.accept_pushes=any"])
    node.wait_ready()
    wait_for(lambda: node.status()["training"]["done"], 30, "training to stop")
    before_status = node.status()
    worker = worker_pid(node.proc.pid)
    own_bytes, own, version = fetch_snapshot(node.addr)
    spec = ModelSpec(own.header.fingerprint, list(own.header.specs))
    first = spec.tensors[0]
    counts = metrics_text(node.addr)

    # Another architecture: another fingerprint, or the same fingerprint with other shapes.
    other_fp = ModelSpec("0123456789abcdef", [TensorSpec("w", (3, 4))])
    foreign_fp = encode(Snapshot(other_fp.header("snapshot", PEER, "ep", 1), {"w": np.ones(12, np.float32)}))
    other_shapes = ModelSpec(spec.fingerprint, [TensorSpec(first.name, (2, 2))])
    foreign_shapes = encode(Snapshot(other_shapes.header("snapshot", PEER, "ep", 1),
                                     {first.name: np.ones(4, np.float32)}))
    # A delta of the right model from a peer we hold no replica of.
    delta = encode(Delta(spec.header("delta", PEER, "ep", 2, base_version=1),
                         {first.name: (np.array([0, 5]), np.array([0.5, -0.5], np.float32))}))

    cases = [
        ("garbage", b"\xc1not msgpack at all\x00\xff" * 10, 400, "malformed"),
        ("truncated", own_bytes[: len(own_bytes) // 2], 400, "malformed"),
        ("not a map", msgpack.packb([1, 2, 3]), 400, "malformed"),
        ("other fingerprint", foreign_fp, 422, "architecture"),
        ("other shapes", foreign_shapes, 422, "architecture"),
        ("NaN in a snapshot", with_nan(own_bytes), 422, "non-finite"),
        ("delta with no replica", delta, 409, "gap"),
    ]
    for what, body, want, _ in cases:
        status, reply = post_model(node.addr, body)
        assert status == want, f"{what}: HTTP {status} {reply[:200]!r}"

    assert declared_too_large(node.addr) == 413
    assert chunked_too_large(node.addr, own_bytes) == 413
    for query in ("since=abc", "since=-1", "since=1e3", "since=" + "9" * 30):
        status, _, reply = http_request(node.addr, "GET", f"/v1/model?{query}")
        assert status == 400, f"{query}: HTTP {status} {reply[:200]!r}"
    status, reply = post_model(node.addr, delta, peer="")  # no ?from=
    assert status == 400, reply

    # Every refusal is counted under its reason.
    after = metrics_text(node.addr)
    expected = {"malformed": 3, "architecture": 2, "non-finite": 1, "gap": 1, "too-large": 2, "bad-request": 5}
    for reason, n in expected.items():
        got = sample_value(after, REJECTED, {"reason": reason}) - sample_value(counts, REJECTED, {"reason": reason})
        assert got == n, f"{REJECTED}{{reason={reason!r}}} went up by {got}, expected {n}"

    # Nothing changed: the public model is bit for bit the same, at the same version.
    time.sleep(1.5)  # the worker publishes what averaging changed at most once a second
    _, again, version_after = fetch_snapshot(node.addr)
    assert version_after == version
    assert list(again.tensors) == list(own.tensors)
    for name, values in own.tensors.items():
        assert np.array_equal(values, again.tensors[name]), f"{name} changed"

    # The daemon and the same worker keep running.
    s = node.status()
    assert s["training"]["worker_alive"] and s["training"]["worker_restarts"] == 0
    assert s["training"]["published_version"] == before_status["training"]["published_version"]
    assert s["exchanges"] == before_status["exchanges"]
    assert node.proc.poll() is None and pid_alive(worker) and worker_pid(node.proc.pid) == worker
    assert http_request(node.addr, "GET", "/healthz")[0] == 200
