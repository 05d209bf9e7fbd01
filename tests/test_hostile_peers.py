"""Peers that waste a node's time, played by an aiohttp fake peer in front of a real daemon.

The fake peer is a real stub daemon advertised at a proxy's address: membership traffic passes
through to the daemon (so the victim verifies and keeps it as a member), but ``GET /v1/model``
gets the attack: "nothing new" (304) or "not ready" (503) after 1.9 s of a 2 s exchange
timeout, or a redirect to a third party. The victim must leave the slow peer out and never
follow the redirect (the third party gets no request at all)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from nodes import STUB, NodeProc, free_port, get_json, wait_for


class FakePeer:
    """An aiohttp server on its own loop and thread: proxies everything but GET /v1/model to
    ``backend``; answers that with ``attack``. ``third_party_hits`` counts requests to the
    third party's server, which it also runs."""

    def __init__(self, attack: str) -> None:
        self.attack = attack
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.third_port = free_port()
        self.third_party_hits = 0
        self.model_gets = 0
        self.backend = ""
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        third = web.Application()
        third.router.add_route("*", "/{tail:.*}", self._third)
        self.third_runner = web.AppRunner(third, access_log=None)
        await self.third_runner.setup()
        await web.TCPSite(self.third_runner, "127.0.0.1", self.third_port).start()

    async def _third(self, request: web.Request) -> web.StreamResponse:
        self.third_party_hits += 1
        return web.Response(status=404)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/v1/model":
            self.model_gets += 1
            if self.attack in ("slow-304", "slow-503"):
                await asyncio.sleep(1.9)
                return web.Response(status=304 if self.attack == "slow-304" else 503)
            if self.attack == "redirect":
                raise web.HTTPFound(f"http://127.0.0.1:{self.third_port}/v1/model?{request.query_string}")
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self.session.request(request.method, f"http://{self.backend}{request.path_qs}", data=body,
                                        headers=headers, allow_redirects=False) as resp:
            data = await resp.read()
            return web.Response(status=resp.status, body=data,
                                headers={"Content-Type": resp.headers.get("Content-Type", "application/octet-stream")})

    def start(self) -> FakePeer:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            await self.runner.cleanup()
            await self.third_runner.cleanup()
            await self.session.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def fake_peer(request: pytest.FixtureRequest) -> Iterator[Callable[[str], FakePeer]]:
    made: list[FakePeer] = []

    def make(attack: str) -> FakePeer:
        made.append(FakePeer(attack).start())
        return made[-1]

    yield make
    for f in made:
        f.stop()


def record(node: NodeProc, peer_id: str) -> dict[str, Any]:
    return get_json(node.addr)["peers"].get(peer_id, {"ok": 0, "failed": 0, "left_out": False, "last_error": ""})


def start_pair(cluster: Callable[..., NodeProc], fake: FakePeer) -> tuple[NodeProc, str]:
    """The victim, and the evil daemon behind ``fake`` (advertised at the proxy's address)."""
    timings = ["--set", "exchange.timeout=2.0", "--set", "exchange.every=1"]
    victim = cluster("victim", extra=[*STUB, *timings])
    victim.wait_ready()
    evil = cluster("evil", seeds=[victim.addr], extra=[*STUB, *timings, "--advertise", fake.addr])
    fake.backend = evil.addr
    evil_id = evil.wait_ready()["node_id"]
    wait_for(lambda: any(m["node_id"] == evil_id and m["state"] == "alive" for m in get_json(victim.addr)["members"]),
             30, "the victim to see the evil peer alive")
    return victim, evil_id


@pytest.mark.parametrize("attack", ["slow-304", "slow-503"])
def test_a_peer_answering_nothing_just_before_the_timeout_is_left_out(
        cluster: Callable[..., NodeProc], fake_peer: Callable[[str], FakePeer], tmp_path: Path, attack: str) -> None:
    fake = fake_peer(attack)
    victim, evil_id = start_pair(cluster, fake)
    # three slow answers in a row (fail_threshold) and the victim leaves the peer out
    rec = wait_for(lambda: (r := record(victim, evil_id))["left_out"] and r, 40, "the slow peer to be left out")
    assert rec["failed"] >= 3 and rec["ok"] == 0, rec
    assert "deadline" in rec["last_error"], rec


def test_a_redirect_is_not_followed(cluster: Callable[..., NodeProc], fake_peer: Callable[[str], FakePeer]) -> None:
    fake = fake_peer("redirect")
    victim, evil_id = start_pair(cluster, fake)
    rec = wait_for(lambda: (r := record(victim, evil_id))["failed"] >= 3 and r, 40, "redirects to count as failures")
    assert "302" in rec["last_error"], rec
    assert fake.model_gets >= 3
    assert fake.third_party_hits == 0
