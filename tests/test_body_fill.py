"""A model-sized answer between a real aiohttp server and ``PeerClient.fetch`` on loopback:
streamed from its parts (net/stream.py, the loop let go between slices), read into one buffer
filled in a thread (net/bodyfill.py), equal byte for byte; a body shorter than its
Content-Length is refused. (How long the loop is held is measured by the benchmarks and
tests/test_big_models.py, not here.)"""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import pytest
from aiohttp import web
from daemon_util import serve_get

from p2pnode.net.bodyfill import BATCH, BodyFill
from p2pnode.net.client import PeerClient, PeerError
from p2pnode.net.deadline import Transfer
from p2pnode.net.stream import PartsResponse


def _parts(total: int) -> list[bytes]:
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, total, dtype=np.uint8).tobytes()
    cut = [0, 17, total // 3, total // 3 + 1, total]  # uneven parts, one of a single byte
    return [data[a:b] for a, b in zip(cut, cut[1:], strict=False)]




def test_a_big_answer_arrives_whole() -> None:
    parts = _parts(3 * BATCH + 12345)
    want = b"".join(parts)

    async def handler(request: web.Request) -> web.StreamResponse:
        return PartsResponse(parts, lambda: hashlib.sha256(want).hexdigest())

    async def main() -> bytes:
        runner, addr = await serve_get("/v1/model", handler)
        try:
            async with PeerClient() as client:
                answer = await client.fetch(addr, "/v1/model", 5.0, Transfer(5.0, 30.0, 1024.0), 1 << 30, gzip=False)
            assert answer.wire_bytes == len(want)
            return bytes(answer.body)
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) == want


def test_a_body_shorter_than_declared_is_refused() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(2 * BATCH)})
        await resp.prepare(request)
        await resp.write(b"x" * BATCH)  # half of it, then the connection ends
        request.transport.close()  # type: ignore[union-attr]
        return resp

    async def main() -> None:
        runner, addr = await serve_get("/v1/model", handler)
        try:
            async with PeerClient() as client:
                with pytest.raises(PeerError):
                    await client.fetch(addr, "/v1/model", 5.0, Transfer(5.0, 30.0, 1024.0), 1 << 30, gzip=False)
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_the_fill_copies_in_order_across_batches() -> None:
    chunks = [bytes([i % 251]) * (BATCH // 3 + i) for i in range(10)]
    want = b"".join(chunks)

    async def main() -> bytes:
        fill = BodyFill(len(want))
        for c in chunks:
            await fill.add(c)
        return bytes(await fill.finish())

    assert asyncio.run(main()) == want


def test_the_sync_and_ps_model_fetcher_reads_a_big_answer_and_keeps_the_rate() -> None:
    from p2pnode.config import Config
    from p2pnode.exchange.model_fetch import ModelFetcher

    parts = _parts(2 * BATCH)
    want = b"".join(parts)

    async def handler(request: web.Request) -> web.StreamResponse:
        return PartsResponse(parts, lambda: hashlib.sha256(want).hexdigest())

    async def main() -> tuple[bytes, float, float]:
        runner, addr = await serve_get("/v1/model", handler)
        try:
            async with PeerClient() as client:
                fetcher = ModelFetcher(client, Config().exchange)
                before = fetcher.transfer(addr).deadline(len(want))
                answer = await fetcher.get(addr, "/v1/model", len(want), len(want))
                return bytes(answer.body), before, fetcher.rates[addr]
        finally:
            await runner.cleanup()

    body, deadline, rate = asyncio.run(main())
    assert body == want
    # before any measurement a body's deadline comes from exchange.min_rate (not one fixed timeout)
    assert deadline > Config().exchange.timeout
    assert rate > 0
