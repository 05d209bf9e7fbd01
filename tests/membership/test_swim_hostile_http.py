"""The membership endpoints over real HTTP on loopback against a raw client: an oversized
chunked body is refused while it streams (the endpoint never waits for the whole of it)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from p2pnode.membership.swim import SwimConfig, SwimMembership
from p2pnode.membership.swim.messages import Gossip, encode
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
