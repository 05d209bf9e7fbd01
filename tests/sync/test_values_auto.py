"""exchange.sync_values = "auto" on the reducer's side (p2pnode/sync/actor.py): the values follow
its own worker's optimizer, known from the worker's hello, so a contribution that comes before
it is held (up to sync_timeout, then 503) rather than parsed as int4 and refused; after it, an
adaptive optimizer's int8 is taken and int4 refused. A real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import msgpack
import numpy as np
from aiohttp import web

from p2pnode.config import Config, set_option
from p2pnode.sync.actor import SYNC_PATH, SyncActor
from p2pnode.sync.values import encode


async def _scenario() -> None:
    cfg = Config()
    set_option(cfg, "exchange.sync_timeout", "0.4")
    hello: dict[str, bool | None] = {"adaptive": None}  # None: our worker has not said hello yet
    actor = SyncActor(cfg, None, None, "c", list, lambda: 1 << 20, lambda request: None,  # type: ignore[arg-type]
                      adaptive=lambda: hello["adaptive"])
    actor.joined.set()
    app = web.Application()
    actor.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}{SYNC_PATH}?phase=0&round=-1&from=x"
    int8 = encode(np.linspace(-3, 3, 100), "int8")
    try:
        async with aiohttp.ClientSession() as session:
            assert actor.status()["values"].startswith("auto (")  # not int4 before the hello
            started = time.monotonic()
            async with session.post(url, data=int8) as resp:
                assert resp.status == 503 and "not started" in await resp.text()
            assert time.monotonic() - started >= 0.35  # held for sync_timeout first

            async def say_hello() -> None:
                await asyncio.sleep(0.1)
                hello["adaptive"] = True  # AdamW: int8

            task = asyncio.create_task(say_hello())
            async with session.post(url, data=int8) as resp:  # held, then taken as int8
                assert resp.status == 200, await resp.text()
                out = msgpack.unpackb(await resp.read(), raw=False)
            await task
            assert out["included"] and out["data"] == int8  # one contribution: its mean is itself
            assert actor.status()["values"] == "int8"
            url1 = url.replace("round=-1", "round=0")
            async with session.post(url1, data=encode(np.linspace(-3, 3, 100), "int4")) as resp:
                assert resp.status == 400  # int4 bytes are not an adaptive optimizer's values
    finally:
        await actor.close()
        await runner.cleanup()


def test_the_reducer_takes_its_workers_values_once_it_has_said_hello() -> None:
    asyncio.run(_scenario())
