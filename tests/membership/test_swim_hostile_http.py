"""The membership endpoints over real HTTP on loopback against a raw client: an oversized
chunked body is refused while it streams (the endpoint never waits for the whole of it), and
any body at all (hypothesis) gets an answer, never a server error."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator

import msgpack
import pytest
from aiohttp import web
from daemon_util import http_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pnode.membership.swim import SwimConfig, SwimMembership
from p2pnode.membership.base import MemberState
from p2pnode.membership.swim.messages import Alive, Dead, Gossip, Left, Ping, PingReq, PushPull, Record, Suspect, encode
from p2pnode.membership.swim.transport import pack
from p2pnode.net.client import PeerClient


@pytest.fixture
async def node() -> AsyncIterator[tuple[SwimMembership, str]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    addr = f"127.0.0.1:{sock.getsockname()[1]}"
    client = PeerClient()
    swim = SwimMembership("victim", addr, client, SwimConfig.lan())
    app = web.Application(client_max_size=64 * 1024 * 1024)  # the daemon's generous app-wide limit
    swim.add_routes(app)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    yield swim, addr
    await runner.cleanup()
    await client.close()


async def _status_line_after(addr: str, first_chunk: bytes, path: str) -> bytes:
    """Send headers and one chunk of a chunked body, then only wait: the reply's status line."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/msgpack\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        writer.write(f"{len(first_chunk):x}\r\n".encode() + first_chunk + b"\r\n")
        await writer.drain()
        # the rest of the 8 MiB never comes: an endpoint that reads the whole body first waits here
        return await asyncio.wait_for(reader.readline(), 5.0)
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["/v1/membership/gossip", "/v1/membership/ping"])
async def test_oversized_chunked_body_is_refused_while_streaming(node, path: str) -> None:
    swim, addr = node
    line = await _status_line_after(addr, b"\x00" * (swim.config.max_message_bytes + 1), path)
    assert line.startswith(b"HTTP/1.1 413"), line
    # and a message within the limit, chunked, is still served
    host, port = addr.rsplit(":", 1)
    body = pack(encode(Gossip("stranger")))
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST /v1/membership/gossip HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\n\r\n"
                 f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    await writer.drain()
    assert (await asyncio.wait_for(reader.readline(), 5.0)).startswith(b"HTTP/1.1 200")
    writer.close()


class ThreadedNode:
    """A SwimMembership serving its endpoints from a background thread's event loop, so that
    hypothesis (synchronous) can post to it example after example."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.swim: SwimMembership | None = None
        self.addr = ""
        self._runner: web.AppRunner | None = None

    async def _start(self) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        self.addr = f"127.0.0.1:{sock.getsockname()[1]}"
        self.swim = SwimMembership("victim", self.addr, PeerClient(), SwimConfig.lan(max_unverified=32))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        self.swim.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def _stop(self) -> None:
        assert self._runner is not None and self.swim is not None
        await self._runner.cleanup()
        await self.swim.transport.client.close()  # type: ignore[attr-defined]

    def __enter__(self) -> ThreadedNode:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def threaded_node() -> Iterator[ThreadedNode]:
    with ThreadedNode() as n:
        yield n


fields = st.sampled_from(["v", "t", "seq", "f", "a", "i", "target", "ta", "timeout_ms", "u", "join", "m"])
values = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=40)
                      | st.sampled_from(["ping", "gossip", "push-pull", "ping-req", "alive", "h:1", "victim"]),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(fields, inner, max_size=6),
                      max_leaves=15)
# well-formed requests of each type, the base that mutations start from
TEMPLATES = [encode(m) for m in (
    Ping(1, "p", "p.test:1", 0, "victim", (Alive("q", 1, "q.test:1"),)),
    PingReq(2, "p", "q", "q.test:1", 500, (Suspect("q", 1, "p"),)),
    Gossip("p", (Dead("q", 1, "p"), Left("r", 0), Alive("s", 2**63 - 1, "s.test:1"))),
    PushPull("p", True, (Record("p", "p.test:1", MemberState.ALIVE, 0), Record("q", "q.test:1", MemberState.DEAD, 3))),
)]
KINDS = ["ping", "ping-req", "gossip", "push-pull", "ack", "nope"]
# (endpoint, body): garbage, random maps, or a well-formed request with a field or two changed
# or dropped, posted to its own endpoint (so that decoding gets past the type check)
mutated = st.tuples(st.sampled_from(TEMPLATES), st.dictionaries(fields, values, max_size=2),
                    st.sets(fields, max_size=1)).map(
    lambda t: (t[0]["t"], {k: v for k, v in {**t[0], **t[1]}.items() if k not in t[2]}))
requests = st.one_of(
    st.tuples(st.sampled_from(KINDS), st.binary(max_size=2048)),
    st.tuples(st.sampled_from(KINDS), st.dictionaries(fields, values, max_size=8).map(lambda d: {"v": 1, **d}).map(
        lambda d: msgpack.packb(d, use_bin_type=True))),
    mutated.map(lambda kd: (kd[0], msgpack.packb(kd[1], use_bin_type=True))),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests)
def test_membership_endpoints_answer_any_body_without_a_server_error(threaded_node: ThreadedNode,
                                                                    req: tuple[str, bytes]) -> None:
    kind, body = req
    status, _, reply = http_request(threaded_node.addr, "POST", f"/v1/membership/{kind}", body,
                                    headers={"Content-Type": "application/msgpack"}, timeout=5)
    assert status in (200, 400, 404, 405, 413), (status, reply[:200])
    if status == 400:
        assert b"\n" not in reply.strip() and len(reply) < 2000  # one clear line
    swim = threaded_node.swim
    assert swim is not None and len(swim.verifier) <= 32 and len(swim.members()) == 1
