"""What a mode of training plugs into the daemon: gossip (the default), the synchronous mode
(``exchange.sync``) and the parameter server (``node.role``) each implement :class:`Mode`.

A mode says which worker process to spawn, which POST routes it adds and how the HTTP guard
treats them, which actors it runs, what it does with the worker's messages of its own, what it
adds to status, and how it starts and closes. ``Node`` (daemon/node.py) builds the parts every
mode shares (supervisor, membership, exchange, HTTP API) and asks the mode for the rest, so it
names no mode; the registry that maps a configuration to its mode is ``p2pnode/modes.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from aiohttp import web

from p2pnode.config import Config
from p2pnode.exchange.rounds import Exchange
from p2pnode.daemon.http import HttpApi, PostRoutes
from p2pnode.daemon.supervisor import WorkerSupervisor
from p2pnode.membership.base import Membership
from p2pnode.net.client import PeerClient
from p2pnode.pipe_protocol import Message


@dataclass(frozen=True)
class ModeBytes:
    """The model bytes a mode moved beyond GET /v1/model and the exchange's fetches: status
    adds them to the node's (``bytes.sent``, ``bytes.received``), so that every mode's traffic
    is counted where gossip's is (status, the demo's report, the dashboard)."""

    #: everything it sent (a synchronous node's contributions, and a reducer's means; a ps-worker's pushes)
    sent: int = 0
    #: everything it took in (a synchronous node's means, a reducer's contributions; pulls, pushes taken)
    received: int = 0
    #: of those, what its own routes on our HTTP server took in and answered (the dashboard
    #: adds these to the HTTP client's counters, which see the rest)
    routes_received: int = 0
    routes_answered: int = 0


@dataclass
class NodeParts:
    """The parts a mode builds on, all made by ``Node`` before the mode."""

    cfg: Config
    node_id: str
    supervisor: WorkerSupervisor
    client: PeerClient
    membership: Membership
    exchange: Exchange
    api: HttpApi
    #: whether this node has joined its cluster
    joined: Callable[[], bool]


class Mode:
    """A mode's daemon side. This base adds nothing: no routes, no actors, no messages."""

    #: its POST routes (class level: the HTTP API is built with them, before the mode)
    routes: ClassVar[PostRoutes] = PostRoutes()
    #: whether a member's fetch asks our worker to publish first (compression.publish_on =
    #: "fetch"): for modes whose worker takes local steps of its own
    publishes_on_fetch: ClassVar[bool] = True

    @classmethod
    def chosen(cls, cfg: Config) -> bool:
        """Whether ``cfg`` asks for this mode."""
        return False

    @classmethod
    def worker_module(cls, cfg: Config) -> str:
        """The module whose ``run(conn, cfg_dict, node_id)`` the spawned worker process runs."""
        from p2pnode.worker import IMPLEMENTATIONS

        return IMPLEMENTATIONS[cfg.training.worker]

    def __init__(self, parts: NodeParts) -> None:
        self.parts = parts

    def add_routes(self, app: web.Application) -> None:
        """Add the mode's routes to the node's HTTP app."""

    def actors(self) -> dict[str, Callable[[], Awaitable[None]]]:
        """The mode's actors by name: run in the node's TaskGroup, restarted with a back-off."""
        return {}

    async def on_message(self, msg: Message) -> None:
        """A worker message the supervisor does not route itself (the mode's own)."""

    def status(self, out: dict[str, Any]) -> None:
        """Add the mode's figures to the node's status (``out``, changed in place)."""

    def bytes_moved(self) -> ModeBytes:
        """The model bytes this mode moved itself (gossip's are the exchange's and the API's)."""
        return ModeBytes()

    def start(self, secret: bytes | None) -> None:
        """Called once the node listens: the mode's warnings about its settings."""

    def joined(self) -> None:
        """Called once the node has joined its cluster."""

    async def close(self) -> None:
        """Called as the node stops, before the worker is stopped."""
