"""Every endpoint of a real daemon against random requests (hypothesis): any method, path, query,
headers and body, with a Content-Length or chunked, always gets an answer below 500, and the
daemon's memory stays bounded. Two daemons: a peer (stub worker, SWIM, with and without a
secret: the model, status, dashboard and SWIM endpoints), and a parameter server with the simple
membership protocol (torch worker; pushes taken from anyone, so garbage reaches the gradient
decoder: ``/v1/ps/gradient`` and the simple protocol's join, sync and leave)."""

from __future__ import annotations

import http.client
import sys
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from nodes import STUB, NodeProc, wait_for

PATHS = ["/v1/model", "/v1/status", "/metrics", "/healthz", "/", "/v1/history", "/v1/cluster",
         "/v1/membership/ping", "/v1/membership/push-pull", "/v1/membership/gossip", "/v1/membership/ping-req",
         "/v1/membership/join", "/nope", "/v1/model/../status", "/static/dashboard.js", "/static/index.html",
         "/static/nope.js", "/static/..%2f..%2fpyproject.toml", "/static/", "/static/%00"]
#: the parameter server's own endpoint and the simple membership protocol's (p2pnode/ps/gradient_route.py,
#: p2pnode/membership/simple.py), with a few of the others
PS_PATHS = ["/v1/ps/gradient", "/v1/membership/join", "/v1/membership/sync", "/v1/membership/leave",
            "/v1/membership/ping", "/v1/model", "/v1/status", "/static/favicon.svg"]
PS_QUERIES = ["", "?from=w1", "?from=", "?from=" + "w" * 65, "?from=%00%ff", "?from=w1&from=w2", "?since=abc"]
QUERIES = ["", "?since=0", "?since=abc", "?since=1&epoch=x", "?from=x", "?from=" + "a" * 100, "?token=x",
           "?since=" + "9" * 40, "?%ff=%00"]


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture(scope="module", params=[False, True], ids=["open", "secret"])
def daemon(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    # gossip's routes, with a secret or without ("auto" would pick the synchronous mode with one)
    extra = [*STUB, "--set", "http.rate_per_source=0", "--set", "http.snapshot_rate_per_source=0",
             "--set", "exchange.sync=none"]
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


@pytest.fixture(scope="module")
def ps_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """A parameter server (torch worker: its loop is torch's) on the simple membership protocol,
    taking pushes from anyone so that random gradients reach its decoder."""
    extra = ["--set", "node.role=ps", "--set", "membership.protocol=simple", "--set", "exchange.accept_pushes=any",
             "--set", "exchange.timeout=5", "--set", "http.rate_per_source=0",
             "--set", "http.snapshot_rate_per_source=0"]
    node = NodeProc(tmp_path_factory.mktemp("fuzz-ps"), "ps", [], extra).start()
    node.wait_ready(90)
    yield node
    ps = node.status()["ps"]
    assert ps["refused"] >= 1 and ps["applied"] == 0, ps  # garbage reached the server's decoder, none applied
    code = node.stop()
    if code != 0:
        sys.stderr.write(node.log()[-4000:])
    assert code == 0
    node.start().wait_ready(90)  # and what it took leaves no state that stops it from starting again
    assert node.stop() == 0


def send(addr: str, method: str, path_qs: str, body: bytes, chunked: bool, headers: dict[str, str]) -> int:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        if chunked and body:
            conn.request(method, path_qs, body=iter([body[: len(body) // 2], body[len(body) // 2:]]),
                         headers=headers, encode_chunked=True)
        else:
            conn.request(method, path_qs, body=body or None, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


#: msgpack maps shaped like the simple protocol's messages (and a gradient header), some fields
#: of the wrong type, out of range or far too long
_ints = st.one_of(st.integers(-2**63, 2**64 - 1), st.sampled_from([0, 1, 2**63 - 1, 2**64 - 1, -1]))
_text = st.one_of(st.text(max_size=20), st.sampled_from(["", "x" * 65, "127.0.0.1:1", "\x00", "a:b:c"]))
_member = st.fixed_dictionaries({}, optional={"node_id": _text, "addr": _text, "incarnation": _ints,
                                              "state": st.sampled_from(["alive", "dead", "left", "suspect", "", 3])})
_message = st.fixed_dictionaries({}, optional={
    "node_id": _text, "addr": _text, "incarnation": _ints,
    "members": st.one_of(st.lists(_member, max_size=8), _text, _ints),
    "fmt": _ints, "kind": _text, "version": _ints})
MESSAGES = _message.map(lambda m: msgpack.packb(m, use_bin_type=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "POST", "PUT", "HEAD"]),
       path=st.sampled_from(PS_PATHS), query=st.sampled_from(PS_QUERIES),
       body=st.one_of(st.binary(max_size=2048), MESSAGES,
                      st.sampled_from([b"\x81\xa3fmt\x01" + b"\0" * 64, b"\x8c\xa3fmt\x01", b"\xde\xff\xff"])),
       chunked=st.booleans(),
       headers=st.dictionaries(st.sampled_from(["Content-Type", "X-P2P-Signature", "X-P2P-Timestamp"]),
                               st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=40),
                               max_size=2))
@example(method="POST", path="/v1/ps/gradient", query="?from=w1", body=b"\x81\xa3fmt\x01" + b"\0" * 64, chunked=True,
         headers={})
@example(method="POST", path="/v1/membership/sync", query="", chunked=False, headers={},
         body=msgpack.packb({"node_id": "g", "addr": "127.0.0.1:1", "incarnation": 2**64 - 1,
                             "members": [{"node_id": "h", "addr": "x", "state": "left", "incarnation": -1}]}))
@example(method="POST", path="/v1/membership/leave", query="", chunked=False, headers={},
         body=msgpack.packb({"node_id": "g", "addr": "", "incarnation": 2**63}))
@example(method="POST", path="/v1/membership/join", query="", chunked=True, headers={},
         body=msgpack.packb({"node_id": "x" * 65, "addr": 3, "incarnation": "1"}))
def test_random_requests_to_a_parameter_server_on_simple_membership_never_get_a_server_error(
        ps_daemon: NodeProc, method: str, path: str, query: str, body: bytes, chunked: bool,
        headers: dict[str, str]) -> None:
    status = send(ps_daemon.addr, method, path + query, body, chunked, headers)
    assert status < 500 or (status == 503 and path in ("/v1/model", "/healthz")), (method, path + query, status)
    assert rss(ps_daemon.pid) < 400 * 1024 * 1024


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
    status = send(daemon.addr, method, path + query, body, chunked, headers)
    assert status < 500 or (status == 503 and path in ("/v1/model", "/healthz")), (method, path + query, status)
    assert rss(daemon.pid) < 400 * 1024 * 1024
