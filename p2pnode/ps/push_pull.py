"""A parameter-server worker's daemon actor (``node.role = "ps-worker"``): push, then pull.

Daemon side, torch-free. The server is the node's first seed (``node.seeds[0]``). Rounds are
driven by the worker process: it hands over one encoded gradient (``PsGradient``), this actor
POSTs it to the server's ``/v1/ps/gradient``, GETs the weights since the version the worker
holds (``GET /v1/model?since=V&epoch=E``: a delta, or a snapshot the first time and after any
gap) and delivers them in "adopt" mode, then ends the round (``PsRoundEnd``). Every network call
has ``exchange.timeout``; a failed push or pull ends the round all the same (the worker goes on
with the weights it has), so a slow or dead server costs the worker time, never a hang.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from p2pnode.config import Config
from p2pnode.daemon.pipe import WorkerPipe
from p2pnode.daemon.state import StepClock
from p2pnode.exchange.model_fetch import ModelFetcher
from p2pnode.exchange.rounds import deliver_timeout
from p2pnode.net.client import DEFAULT_MAX_BODY, PeerClient, PeerError
from p2pnode.pipe_protocol import ADOPT, Message
from p2pnode.ps.messages import PsGradient, PsRoundEnd
from p2pnode.ps.gradient_route import PATH

log = logging.getLogger("p2pnode.ps")


class PsClient:
    def __init__(self, cfg: Config, pipe: WorkerPipe, clock: StepClock, client: PeerClient, node_id: str) -> None:
        if not cfg.node.seeds:
            raise ValueError("node.role = ps-worker needs the server's address as its first seed (--seed)")
        self.cfg = cfg
        self.pipe = pipe
        self.clock = clock
        self.client = client
        self.fetcher = ModelFetcher(client, cfg.exchange)
        #: the largest answer of our model (wire/codec.py payload_limit; set by the mode)
        self.max_body: Callable[[], int] = lambda: DEFAULT_MAX_BODY
        self.node_id = node_id
        self.server = cfg.node.seeds[0]
        self.gradients: asyncio.Queue[PsGradient] = asyncio.Queue(maxsize=4)
        self.version: int | None = None  # the server version our worker holds (None: needs a snapshot)
        self.epoch = ""
        self.worker_epoch = ""
        self.totals = {"pushes": 0, "push_failures": 0, "pulls": 0, "pull_failures": 0, "bytes_pushed": 0,
                       "bytes_pulled": 0, "snapshots": 0}
        self.round_seconds: list[float] = []  # push + pull of the last rounds

    async def on_message(self, msg: Message) -> None:
        """The supervisor's hook for messages it does not route itself."""
        if isinstance(msg, PsGradient):
            if self.gradients.full():  # a round outlived several gradients: keep the newest
                self.gradients.get_nowait()
            self.gradients.put_nowait(msg)

    async def push(self, grad: PsGradient) -> bool:
        timeout = self.cfg.exchange.timeout
        try:
            resp = await self.client.request("POST", self.server, f"{PATH}?from={self.node_id}", grad.data, timeout)
        except PeerError as exc:
            log.warning("push to the server failed: %s", exc)
            self.totals["push_failures"] += 1
            return False
        if resp.status != 200:
            log.warning("the server refused a push: HTTP %d %s", resp.status, resp.body[:200])
            self.totals["push_failures"] += 1
            return False
        self.totals["pushes"] += 1
        self.totals["bytes_pushed"] += len(grad.data)
        return True

    async def pull(self) -> bool:
        query = "/v1/model" if self.version is None else f"/v1/model?since={self.version}&epoch={self.epoch}"
        try:
            # the server's weights are model-sized: the exchange's deadlines from their size
            resp = await self.fetcher.get(self.server, query, self.max_body(), 4 * self.pipe.params)
        except PeerError as exc:
            log.warning("pull from the server failed: %s", exc)
            self.totals["pull_failures"] += 1
            return False
        if resp.status == 304:
            return False
        if resp.status != 200:
            self.totals["pull_failures"] += 1
            return False
        self.totals["bytes_pulled"] += len(resp.body)
        if resp.headers.get("X-P2P-Kind") == "snapshot":
            self.totals["snapshots"] += 1
        try:
            applied = await self.pipe.deliver(self.server, resp.body, ADOPT, deliver_timeout(len(resp.body)))
        except (TimeoutError, ConnectionError, OSError):
            return False
        if not applied.ok:
            log.info("the worker refused the server's weights (%s): asking for a snapshot", applied.reason)
            self.version = None
            self.totals["pull_failures"] += 1
            return False
        self.version, self.epoch = applied.version, applied.epoch
        self.totals["pulls"] += 1
        return True

    async def run(self) -> None:
        await self.clock.ready.wait()
        while True:
            if self.clock.epoch != self.worker_epoch:  # a new worker process holds no weights yet
                self.worker_epoch, self.version = self.clock.epoch, None
                while not self.gradients.empty():
                    self.gradients.get_nowait()
                while not await self.pull():  # its first round: the server's weights, however long it takes
                    await asyncio.sleep(0.5)
                grad = None
            else:
                try:  # a second at a time: a restarted worker (new epoch) waits for weights, not us
                    # asyncio.timeout, not wait_for: 3.11's wait_for can drop a cancellation that
                    # lands as the get completes, and this loop would then never end
                    async with asyncio.timeout(1.0):
                        grad = await self.gradients.get()
                except TimeoutError:
                    continue
            started = time.monotonic()
            pushed = await self.push(grad) if grad is not None else False
            pulled = await self.pull() if grad is not None else True
            self.round_seconds = [*self.round_seconds[-99:], time.monotonic() - started]
            try:
                async with asyncio.timeout(self.cfg.exchange.timeout):
                    await self.pipe.send(PsRoundEnd(pushed=pushed, pulled=pulled, version=self.version or -1))
            except (TimeoutError, ConnectionError):
                pass  # the worker is gone; the supervisor restarts it and we start over

    def status(self) -> dict[str, Any]:
        rounds = sorted(self.round_seconds)
        return {"role": "ps-worker", "server": self.server, "version": self.version, **self.totals,
                "round_seconds_median": round(rounds[len(rounds) // 2], 4) if rounds else None}
