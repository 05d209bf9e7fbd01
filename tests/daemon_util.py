"""Small helpers for tests that talk to real daemons: raw HTTP (signed or not), metrics; and the
process helpers of ``benchlib.procs`` (a daemon's worker, whether a pid is alive)."""

from __future__ import annotations

import http.client
from collections.abc import Iterable
from typing import Any

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from benchlib.procs import children, cmdline, pid_alive, worker_pid
from p2pnode.net.auth import sign
from p2pnode.wire.codec import decode
from p2pnode.wire.payload import Snapshot

__all__ = ["children", "cmdline", "fetch_snapshot", "http_request", "metrics_text", "pid_alive", "sample_value",
           "declared_post", "serve_get", "worker_pid"]


def http_request(addr: str, method: str, path_qs: str, body: bytes | Iterable[bytes] = b"",
                 headers: dict[str, str] | None = None, secret: bytes | None = None,
                 timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection; an iterable body goes out chunked (no Content-Length)."""
    host, _, port = addr.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    hdrs = dict(headers or {})
    if secret is not None:
        assert isinstance(body, bytes)
        hdrs.update(sign(secret, method, path_qs, body))
    try:
        if isinstance(body, bytes):
            conn.request(method, path_qs, body=body or None, headers=hdrs)
        else:
            conn.request(method, path_qs, body=body, headers=hdrs, encode_chunked=True)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def fetch_snapshot(addr: str) -> tuple[bytes, Snapshot, str]:
    """A node's public model as a full snapshot: its bytes, decoded, and its version header."""
    status, headers, body = http_request(addr, "GET", "/v1/model")
    assert status == 200 and headers["x-p2p-kind"] == "snapshot", (status, headers)
    snap = decode(body)
    assert isinstance(snap, Snapshot)
    return body, snap, headers["x-p2p-version"]


def metrics_text(addr: str) -> str:
    status, _, body = http_request(addr, "GET", "/metrics")
    assert status == 200, status
    return body.decode()


def sample_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one sample (0.0 when a labelled counter has not been touched yet)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and (labels is None or all(s.labels.get(k) == v for k, v in labels.items())):
                return float(s.value)
    return 0.0


async def serve_get(path: str, handler: Any) -> tuple[web.AppRunner, str]:
    """A real aiohttp server on a free loopback port answering GET ``path`` with ``handler``:
    its runner (``await runner.cleanup()`` after) and its address."""
    app = web.Application()
    app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}"


def declared_post(addr: str, path: str, length: int, headers: dict[str, str] | None = None,
                  first: bytes = b"\0" * 16) -> int:
    """The status of a POST declaring ``length`` bytes that sends only ``first`` of them: an
    answer given from the headers must not wait for the rest."""
    host, _, port = addr.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10.0)
    try:
        conn.putrequest("POST", path)
        conn.putheader("Content-Length", str(length))
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        conn.send(first)
        return conn.getresponse().status
    finally:
        conn.close()
