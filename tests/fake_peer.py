"""A fake peer for attack tests: an aiohttp proxy in front of a real daemon that plays one
attack on ``GET /v1/model`` and passes everything else through (so the victim verifies it as a
member), and a third party's server that counts the requests it gets.

Imported as ``from fake_peer import FakePeer``."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
from aiohttp import web

from nodes import free_port


class FakePeer:
    """An aiohttp server on its own loop and thread: proxies everything to ``backend`` (the
    X-P2P headers included) but answers GET /v1/model as ``attack`` says: "slow-304",
    "slow-503" (after 1.9 s), "redirect" (to a third party whose server it also runs and whose
    requests ``third_party_hits`` counts), "tamper" (the real answer with one bit flipped) or
    "trickle" (the real answer, its Content-Length announced, 100 bytes every half second)."""

    def __init__(self, attack: str) -> None:
        self.attack = attack
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.third_port = free_port()
        self.third_party_hits = 0
        self.model_gets = 0
        self.tampered = 0
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
        tamper = self.attack == "tamper" and request.method == "GET" and request.path == "/v1/model"
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self.session.request(request.method, f"http://{self.backend}{request.path_qs}", data=body,
                                        headers=headers, allow_redirects=False) as resp:
            data = await resp.read()
            if tamper and resp.status == 200 and data:
                self.tampered += 1
                data = data[:-1] + bytes([data[-1] ^ 1])  # one bit of the last value
            headers = {k: v for k, v in resp.headers.items() if k.startswith("X-P2P") or k == "Content-Encoding"}
            headers["Content-Type"] = resp.headers.get("Content-Type", "application/octet-stream")
            if self.attack == "trickle" and request.path == "/v1/model" and resp.status == 200:
                return await self._trickle(request, data, headers)
            return web.Response(status=resp.status, body=data, headers=headers)

    async def _trickle(self, request: web.Request, data: bytes, headers: dict[str, str]) -> web.StreamResponse:
        out = web.StreamResponse(status=200, headers=headers)
        out.content_length = len(data)
        await out.prepare(request)
        try:
            for at in range(0, len(data), 100):
                await out.write(data[at:at + 100])
                await asyncio.sleep(0.5)
        except (ConnectionError, RuntimeError):  # the victim hung up: what it should do
            pass
        return out

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
