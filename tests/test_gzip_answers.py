"""gzip model answers (p2pnode/net/encoding.py): a node answers ``GET /v1/model`` in gzip only
when asked, with the very bytes it would send otherwise, packed; the fetching client inflates
them, counts what the network carried, and refuses a gzip body it did not ask for, one that
inflates past its limit, and a broken one. A real daemon (stub worker) and a real aiohttp
server on loopback."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import pytest
from aiohttp import web
from daemon_util import http_request

from nodes import STUB, wait_for
from p2pnode.net.client import PeerClient, PeerError
from p2pnode.net.encoding import gunzip, gzip_if_smaller, wants_gzip


@pytest.mark.parametrize(("header", "wanted"), [
    ("gzip", True), ("GZIP", True), ("deflate, gzip;q=0.5", True), ("gzip;q=1.0, identity", True), ("", False),
    ("identity", False), ("gzip;q=0", False), ("gzip;q=0.000", False), ("gzip;q=x", False), ("gzipx", False),
    ("br, zstd", False), ("gzip;level=9", False)])
def test_which_accept_encoding_takes_gzip(header: str, wanted: bool) -> None:
    assert wants_gzip(header) is wanted


def test_gzip_only_where_smaller_and_inflate_only_within_the_limit() -> None:
    assert gzip_if_smaller(b"x" * 100) is None  # too short to be worth it
    assert gzip_if_smaller(bytes(range(256)) * 2) is not None
    import os
    assert gzip_if_smaller(os.urandom(4096)) is None  # random bytes do not shrink
    body = b"\x01\x00" * 50_000
    packed = gzip_if_smaller(body)
    assert packed is not None and len(packed) < 1000 and gzip_if_smaller(body) == packed  # the same bytes each time
    assert gunzip(packed, len(body)) == body
    with pytest.raises(ValueError, match="limit"):
        gunzip(packed, len(body) - 1)  # a bomb: a small body that would inflate past the limit
    for broken in (packed[:-3], packed + b"tail", packed + packed, b"not gzip at all", zlib.compress(body)):
        with pytest.raises(ValueError):
            gunzip(broken, 10 * len(body))


def test_a_node_answers_in_gzip_only_when_asked(cluster) -> None:
    # accept_pushes = any: the test's client, not a member, may make the node publish for it;
    # publish_every far out: nothing else publishes, so one version's bytes can be asked twice
    a = cluster("a", extra=[*STUB, "--set", "compression.publish_on=fetch", "--set", "exchange.accept_pushes=any",
                            "--set", "compression.publish_every=100000"])
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["step"] > 5, 30, "a to train")
    status, headers, packed = http_request(a.addr, "GET", "/v1/model?since=0&from=0123456789abcdef&gzip=1",
                                           headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["x-p2p-version"] == "1", headers
    assert headers.get("content-encoding") == "gzip", headers
    status, plain_headers, plain = http_request(a.addr, "GET", "/v1/model?since=0")  # http.client: identity
    assert status == 200 and plain_headers["x-p2p-version"] == "1" and "content-encoding" not in plain_headers
    assert gzip.decompress(packed) == plain and len(packed) < len(plain)
    # an older p2pnode's fetch: aiohttp's default "gzip, deflate", no gzip=1 (it would not inflate)
    _, old_headers, old = http_request(a.addr, "GET", "/v1/model?since=0", headers={"Accept-Encoding": "gzip, deflate"})
    assert "content-encoding" not in old_headers and old == plain
    # the status and metrics count what went on the wire
    assert a.status()["bytes"]["model_served"] == len(packed) + 2 * len(plain)

    async def fetch() -> tuple[bytes, int]:
        async with PeerClient() as client:
            resp = await client.request("GET", a.addr, "/v1/model?since=0", timeout=5, gzip=True)
            assert resp.status == 200 and resp.headers.get("Content-Encoding") == "gzip"
            return resp.body, resp.wire_bytes
    body, wire = asyncio.run(fetch())
    assert body == plain and wire == len(packed)


class Liar:
    """A peer's HTTP server that answers every GET with ``body`` marked as gzip."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aenter__(self) -> str:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=self.body, headers={"Content-Encoding": "gzip"})
        app = web.Application()
        app.router.add_get("/v1/model", handler)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"127.0.0.1:{self.runner.addresses[0][1]}"

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


async def test_the_client_refuses_gzip_it_did_not_ask_for_a_bomb_and_a_broken_body() -> None:
    bomb = gzip.compress(bytes(50_000_000), 9)  # 50 MB of zeros in about 50 KB
    assert len(bomb) < 100_000
    async with PeerClient(max_body=1_000_000) as client:
        async with Liar(gzip.compress(b"payload" * 100)) as addr:
            assert (await client.request("GET", addr, "/v1/model", timeout=5, gzip=True)).body == b"payload" * 100
            with pytest.raises(PeerError, match="not asked for"):
                await client.request("GET", addr, "/v1/model", timeout=5)
        async with Liar(bomb) as addr:
            with pytest.raises(PeerError, match="limit"):
                await client.request("GET", addr, "/v1/model", timeout=5, gzip=True)
        async with Liar(gzip.compress(b"payload" * 100)[:-5]) as addr:
            with pytest.raises(PeerError, match="truncated"):
                await client.request("GET", addr, "/v1/model", timeout=5, gzip=True)
