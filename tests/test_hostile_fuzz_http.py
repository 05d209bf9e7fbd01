"""Every endpoint of a real daemon (stub worker, with and without a secret) against random
requests (hypothesis): any method, path, query, headers and body, with a Content-Length or
chunked, always gets an answer below 500, and the daemon's memory stays bounded."""

from __future__ import annotations

import http.client
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodes import STUB, NodeProc, wait_for

PATHS = ["/v1/model", "/v1/status", "/metrics", "/healthz", "/", "/v1/history", "/v1/cluster",
         "/v1/membership/ping", "/v1/membership/push-pull", "/v1/membership/gossip", "/v1/membership/ping-req",
         "/v1/membership/join", "/nope", "/v1/model/../status"]
QUERIES = ["", "?since=0", "?since=abc", "?since=1&epoch=x", "?from=x", "?from=" + "a" * 100, "?token=x",
           "?since=" + "9" * 40, "?%ff=%00"]


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture(scope="module", params=[False, True], ids=["open", "secret"])
def daemon(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    extra = [*STUB, "--set", "http.rate_per_source=0", "--set", "http.snapshot_rate_per_source=0"]
    if request.param:
        extra += ["--set", "node.secret=fuzz"]
    node = NodeProc(tmp_path_factory.mktemp("fuzz"), "a", [], extra).start()
    host, port = node.addr.rsplit(":", 1)

    def healthy() -> bool:
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        finally:
            conn.close()

    wait_for(healthy, 40, "the daemon to be healthy")
    yield node
    code = node.stop()
    if code != 0:
        sys.stderr.write(node.log()[-4000:])
    assert code == 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]),
       path=st.sampled_from(PATHS), query=st.sampled_from(QUERIES),
       body=st.one_of(st.binary(max_size=2048), st.sampled_from([b"\x80", b"\x8c\xa3fmt\x01", b"\xde\xff\xff"])),
       chunked=st.booleans(),
       headers=st.dictionaries(st.sampled_from(["Content-Type", "X-P2P-Signature", "X-P2P-Timestamp", "X-P2P-Nonce",
                                                "Authorization", "Cookie", "Accept-Encoding"]),
                               st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=80),
                               max_size=4))
def test_random_requests_never_get_a_server_error(daemon: NodeProc, method: str, path: str, query: str, body: bytes,
                                                  chunked: bool, headers: dict[str, str]) -> None:
    host, port = daemon.addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        if chunked and body:
            conn.request(method, path + query, body=iter([body[: len(body) // 2], body[len(body) // 2:]]),
                         headers=headers, encode_chunked=True)
        else:
            conn.request(method, path + query, body=body or None, headers=headers)
        status = conn.getresponse().status
    finally:
        conn.close()
    assert status < 500 or (status == 503 and path in ("/v1/model", "/healthz")), (method, path + query, status)
    assert rss(daemon.pid) < 400 * 1024 * 1024
