"""The parameter server's two roles plugged into the daemon (``node.role``): ``"ps"`` serves
``POST /v1/ps/gradient`` to its workers' pushes, ``"ps-worker"`` runs the push-and-pull actor in
the exchange's place. Neither averages with peers, so training's end is their consensus."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from p2pnode.config import Config
from p2pnode.daemon.http import PostRoutes
from p2pnode.daemon.mode import Mode, ModeBytes, NodeParts
from p2pnode.pipe_protocol import Message
from p2pnode.ps.gradient_route import PATH, PsServer
from p2pnode.ps.push_pull import PsClient


def _done(out: dict[str, Any], parts: NodeParts) -> None:
    """No averaging in the parameter-server roles: done is the end."""
    out["consensus"] = {"reached": parts.supervisor.clock.done, "role": parts.cfg.node.role}


class PsServerMode(Mode):
    # pushed gradients: from members only, a model payload's size at most, a payload from the first bytes
    routes = PostRoutes(members_only=(PATH,), model_sized=(PATH,), payloads=(PATH,))
    publishes_on_fetch = False  # its worker publishes after every push it applies

    @classmethod
    def chosen(cls, cfg: Config) -> bool:
        return cfg.node.role == "ps"

    @classmethod
    def worker_module(cls, cfg: Config) -> str:
        return "p2pnode.ps.worker_server"

    def __init__(self, parts: NodeParts) -> None:
        super().__init__(parts)
        self.server = PsServer(parts.cfg, parts.api, parts.supervisor.pipe)

    def add_routes(self, app: web.Application) -> None:
        self.server.add_routes(app)

    def status(self, out: dict[str, Any]) -> None:
        out["ps"] = self.server.status()
        _done(out, self.parts)

    def bytes_moved(self) -> ModeBytes:  # the gradients pushed to us (the weights: GET /v1/model's)
        got = self.server.bytes_received
        return ModeBytes(received=got, routes_received=got)


class PsWorkerMode(Mode):
    publishes_on_fetch = False  # it trains on the server's model, not a model of its own

    @classmethod
    def chosen(cls, cfg: Config) -> bool:
        return cfg.node.role == "ps-worker"

    @classmethod
    def worker_module(cls, cfg: Config) -> str:
        return "p2pnode.ps.worker_client"

    def __init__(self, parts: NodeParts) -> None:
        super().__init__(parts)
        sup = parts.supervisor
        self.client = PsClient(parts.cfg, sup.pipe, sup.clock, parts.client, parts.node_id)
        self.client.max_body = parts.exchange.max_body  # the largest answer of our model

    def actors(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {"push-pull": self.client.run}

    async def on_message(self, msg: Message) -> None:
        await self.client.on_message(msg)

    def status(self, out: dict[str, Any]) -> None:
        out["ps"] = self.client.status()
        _done(out, self.parts)

    def bytes_moved(self) -> ModeBytes:  # our pushes and the server's weights we pulled
        t = self.client.totals
        return ModeBytes(sent=t["bytes_pushed"], received=t["bytes_pulled"])
