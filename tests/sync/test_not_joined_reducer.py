"""A reducer that has not joined yet (p2pnode/sync/actor.py): the lowest id, running (a node
back from a restart, or slow to start), but it reduces only once it has joined. It held a
contribution for ``sync_timeout`` and answered 503; each node held there took a local step with
its own gradient, and the models went apart until the models' mean after training (seen in the
benchmarks: every survivor of a kill, and every node whose reducer was the slow node at the
start). Now the senders take the next reducer for that round. Real actors, each behind its own
HTTP server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
from aiohttp import web

from p2pnode.config import Config
from p2pnode.membership.base import Member
from p2pnode.net.client import PeerClient
from p2pnode.sync.actor import SyncActor
from p2pnode.sync.messages import SyncContribute
from p2pnode.sync.values import encode


def config() -> Config:
    cfg = Config()
    cfg.exchange.sync_timeout = 0.3
    cfg.exchange.timeout = 2.0
    return cfg


@asynccontextmanager
async def serving(actor: SyncActor) -> AsyncIterator[str]:
    app = web.Application()
    actor.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def test_a_reducer_not_joined_yet_is_passed_over_for_the_next_one_not_a_local_step() -> None:
    async def go() -> None:
        cfg = config()
        members: dict[str, list[Member]] = {"a": [], "b": [], "c": []}
        async with PeerClient() as client:
            actors = {n: SyncActor(cfg, None, client, n, lambda n=n: members[n],  # type: ignore[arg-type]
                                   lambda: 1 << 20, lambda request: None) for n in "abc"}
            async with serving(actors["a"]) as addr_a, serving(actors["b"]) as addr_b:
                everyone = [Member("a", addr_a), Member("b", addr_b), Member("c", "127.0.0.1:1")]
                for n in "abc":
                    members[n][:] = [m for m in everyone if m.node_id != n]
                actors["b"].joined.set()  # "a" (the lowest id) has not joined: it restarted
                data = encode(np.ones(64, dtype=np.float32), cfg.exchange.sync_values)
                assert actors["c"].reducer_of(0)[0] == "a"
                out = await actors["c"]._contribute(SyncContribute(phase=0, round=-1, data=data))
                # through "b", which closes the round with the one node that came (after its
                # wait for the others): our contribution is in a mean, not left to a local step
                assert out.included and out.count == 1 and out.data
                assert actors["c"].current[0] == "b" and actors["b"].reducer.rounds == 0
                assert actors["c"].totals["failures"] == 1 and "a" in actors["c"].unreachable
                # while "a" is passed over, the next round goes to "b" at once
                assert actors["c"].reducer_of(1)[0] == "b"
                # once joined, "a" reduces what it is sent
                actors["a"].joined.set()
                resp = await client.request("POST", addr_a, "/v1/sync?phase=0&round=-1&from=b", data, 5.0)
                assert resp.status == 200
            for a in actors.values():
                await a.close()
    asyncio.run(go())
