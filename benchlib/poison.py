"""A member that serves a poisoned model: an aiohttp proxy in front of a real daemon.

The daemon behind it is an ordinary node started with ``--advertise`` at the proxy's address:
its membership traffic passes through untouched (so its peers verify it and keep it as a
member) and it trains and averages like any node. But every ``GET /v1/model`` its peers send
gets a *full snapshot of a poisoned model* made from the daemon's real public model x̂, which
the proxy keeps as a real replica (``p2pnode.wire.replica``, fed with the daemon's deltas):

- ``sign-flip``: −x̂ (the Byzantine "sign flipping" attack, applied to the model);
- ``scale100``: 100·x̂;
- ``random``: Gaussian noise with each tensor's RMS, drawn afresh for every answer.

The payloads are valid (the wire format, the model's layout, finite values), so only robust
averaging (``exchange.robust = "clip"``) stands between them and the peers' models. Used by
``scripts/bench_poison.py`` and ``tests/test_poisoned_peer.py``. No cluster secret: a hostile
member would hold it anyway.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from benchlib.cluster import TrainResult, train
from benchlib.status import free_port
from p2pnode.wire.codec import decode, encode
from p2pnode.wire.payload import ModelSpec, PayloadError, Snapshot
from p2pnode.wire.replica import Replica

ATTACKS = ("sign-flip", "scale100", "random")
#: what every poisoned-model run sets: no consensus finish (without robust averaging the honest
#: nodes could never agree with a poisoned peer and would wait for it forever), no bootstrap
#: (the nodes start together from the same seed; a bootstrap adopts a model whole, unclipped)
SETTINGS = ("--set", "exchange.consensus_tolerance=0", "--set", "membership.bootstrap_from_peer=false")


def poison(attack: str, arrays: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The poisoned tensors for ``attack`` from the real ones (flat float32 arrays)."""
    if attack == "sign-flip":
        return {k: -a for k, a in arrays.items()}
    if attack == "scale100":
        return {k: (100.0 * a).astype(np.float32) for k, a in arrays.items()}
    if attack == "random":
        out = {}
        for k, a in arrays.items():
            rms = float(np.sqrt(np.mean(a.astype(np.float64) ** 2))) if a.size else 0.0
            out[k] = (rng.standard_normal(a.size) * rms).astype(np.float32)
        return out
    raise ValueError(f"unknown attack {attack!r}; choose one of {', '.join(ATTACKS)}")


class PoisonProxy:
    """Serves ``attack`` at ``addr`` for the daemon at ``backend`` (set before peers ask)."""

    def __init__(self, attack: str, backend: str = "", port: int | None = None, seed: int = 0) -> None:
        if attack not in ATTACKS:
            raise ValueError(f"unknown attack {attack!r}; choose one of {', '.join(ATTACKS)}")
        self.attack = attack
        self.backend = backend
        self.port = port or free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.rng = np.random.default_rng(seed)
        self.replica: Replica | None = None
        self.poisoned = 0  #: poisoned snapshots served
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"poison-{attack}")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=10))
        self.lock = asyncio.Lock()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def _refresh(self) -> None:
        """Bring the replica of the daemon's x̂ up to date (a delta, or a snapshot at first)."""
        r = self.replica
        query = f"/v1/model?since={r.version}&epoch={r.epoch}" if r is not None and r.ready else "/v1/model"
        async with self.session.get(f"http://{self.backend}{query}", headers={"Accept-Encoding": "identity"}) as resp:
            if resp.status != 200:
                return  # 304: nothing new; 503/429: keep what we have
            data = await resp.read()
        try:
            payload = decode(data)
            if isinstance(payload, Snapshot) or r is None:
                h = payload.header
                r = Replica(ModelSpec(h.fingerprint, h.specs), h.node_id)
            r.apply(payload, validate=False)
            self.replica = r
        except PayloadError:
            self.replica = None  # a gap (the daemon restarted): a snapshot next time

    async def _model(self) -> web.StreamResponse:
        async with self.lock:
            try:
                await self._refresh()
            except (TimeoutError, aiohttp.ClientError):
                pass
            r = self.replica
            if r is None or not r.ready:
                return web.Response(status=503)
            header = r.spec.header("snapshot", r.node_id, r.epoch, r.version, step=r.step, loss=r.loss)
            body = encode(Snapshot(header, poison(self.attack, r.arrays, self.rng)))
            self.poisoned += 1
        return web.Response(body=body, content_type="application/msgpack",
                            headers={"X-P2P-Version": str(r.version), "X-P2P-Kind": "snapshot"})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/v1/model":
            return await self._model()
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        try:
            async with self.session.request(request.method, f"http://{self.backend}{request.path_qs}", data=body,
                                            headers=headers, allow_redirects=False) as resp:
                data = await resp.read()
                out = {k: v for k, v in resp.headers.items() if k.startswith("X-P2P") or k == "Content-Encoding"}
                out["Content-Type"] = resp.headers.get("Content-Type", "application/octet-stream")
                return web.Response(status=resp.status, body=data, headers=out)
        except (TimeoutError, aiohttp.ClientError):
            return web.Response(status=502)

    def start(self) -> PoisonProxy:
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("the poison proxy did not start")
        return self

    def stop(self) -> None:
        async def close() -> None:
            await self.runner.cleanup()
            await self.session.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def train_attacked(name: str, workdir: Path, nodes: int, samples: int, attack: str, extra: Sequence[str] = (),
                   port: int = 7611, timeout: float = 600.0,
                   progress: Callable[[float, list[dict[str, Any] | None]], None] | None = None,
                   data_dir: str = "") -> tuple[TrainResult, int]:
    """``benchlib.cluster.train`` with the last node serving ``attack`` through a proxy ("none":
    an ordinary run with the same settings); the result and how many poisoned models were served.
    ``data_dir``: the nodes' data folder (``train``'s)."""
    attacker = nodes - 1
    proxy = PoisonProxy(attack, backend=f"127.0.0.1:{port + attacker}") if attack != "none" else None

    def advertise(i: int) -> list[str]:
        return ["--advertise", proxy.addr] if proxy is not None and i == attacker else []

    if proxy is not None:
        proxy.start()
    try:
        res = train(name, workdir, nodes, samples, [*SETTINGS, *extra], port, timeout, progress=progress,
                    node_args=advertise, data_dir=data_dir)
    finally:
        if proxy is not None:
            proxy.stop()
    return res, proxy.poisoned if proxy is not None else 0


#: the folder whose sitecustomize makes a node's worker a hostile member of the synchronous mode
SYNC_ATTACK = Path(__file__).resolve().parent / "sync_attack"


def train_sync_attacked(name: str, workdir: Path, nodes: int, samples: int, scale: float, extra: Sequence[str] = (),
                        port: int = 7611, timeout: float = 600.0, **kwargs: Any) -> TrainResult:
    """``benchlib.cluster.train`` in the synchronous mode with the last node hostile: each of its
    contributions to a step's mean is its honest one times ``scale`` (``benchlib/sync_attack``;
    1: an honest run with the same settings). ``extra`` must hold the synchronous mode's
    settings; ``kwargs`` go to ``train``."""

    def env(i: int) -> dict[str, str]:
        if i != nodes - 1 or scale == 1:
            return {}
        path = os.environ.get("PYTHONPATH", "")
        return {"PYTHONPATH": f"{SYNC_ATTACK}{os.pathsep + path if path else ''}", "P2P_SYNC_ATTACK": repr(scale)}

    return train(name, workdir, nodes, samples, extra, port, timeout, node_env=env, **kwargs)
