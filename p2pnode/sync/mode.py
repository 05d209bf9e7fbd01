"""The synchronous mode's plug into the daemon (``exchange.sync = "powersgd"``, or "auto" with a
cluster secret: p2pnode/config/mode_rule.py; peers only):
its route ``POST /v1/sync``, the actor that carries the worker's contributions to the reducer,
its status block, and its warnings. No gossip runs beside the all-reduce."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from p2pnode.config import Config
from p2pnode.config.mode_rule import sync_of
from p2pnode.daemon.http import PostRoutes
from p2pnode.daemon.mode import Mode, ModeBytes, NodeParts
from p2pnode.pipe_protocol import Message
from p2pnode.sync.actor import SYNC_PATH, SyncActor

log = logging.getLogger("p2pnode.node")


class SyncMode(Mode):
    # contributions come from members only, are a model's size at most, and a restarted reducer
    # checks membership once it has joined (the actor holds them until then)
    routes = PostRoutes(members_only=(SYNC_PATH,), model_sized=(SYNC_PATH,), checked_after_join=(SYNC_PATH,),
                        per_step=(SYNC_PATH,))

    @classmethod
    def chosen(cls, cfg: Config) -> bool:
        return sync_of(cfg) == "powersgd" and cfg.node.role == "peer"

    def __init__(self, parts: NodeParts) -> None:
        super().__init__(parts)
        sup, api = parts.supervisor, parts.api
        self.actor = SyncActor(parts.cfg, sup.pipe, parts.client, parts.node_id, parts.membership.alive_peers,
                               api.post_limit, api.pushes.precheck, classes=lambda: sup.state.classes,
                               adaptive=lambda: sup.state.adaptive if sup.state.epoch else None)
        # no gossip runs beside the all-reduce, so no start from a peer's model either: every
        # node starts from the seeded model (training.seed) and takes the same steps
        parts.exchange.boot.settle("off")

    def add_routes(self, app: web.Application) -> None:
        self.actor.add_routes(app)

    def actors(self) -> dict[str, Callable[[], Awaitable[None]]]:
        # the all-reduce keeps every node's model the same: averaging with a peer's public
        # copy (which only tracks the model on fetches) would pull ours back, not together
        return {}

    async def on_message(self, msg: Message) -> None:
        await self.actor.on_message(msg)

    def status(self, out: dict[str, Any]) -> None:
        out["sync"] = self.actor.status()
        out["bytes"]["sync_received"] = self.actor.totals["bytes_received"]
        out["bytes"]["sync_sent"] = self.actor.totals["bytes_sent"]
        out["consensus"] = {"reached": self.parts.supervisor.clock.done, "sync": sync_of(self.parts.cfg)}

    def bytes_moved(self) -> ModeBytes:
        t, routes = self.actor.totals, self.actor.route_bytes
        return ModeBytes(t["bytes_sent"], t["bytes_received"], routes["received"], routes["answered"])

    def start(self, secret: bytes | None) -> None:
        cfg = self.parts.cfg
        if secret is None:
            # the member with the lowest id reduces, a member chooses its id, and every node
            # steps along the mean the reducer answers: a stranger could become the reducer
            log.warning("exchange.sync = %s without a secret: any host that joins can take the lowest id "
                        "and answer every node's step; use it only among machines you run, with "
                        "node.secret_file (docs/ALGORITHMS.md)", cfg.exchange.sync)
        if cfg.training.min_peers == 0:
            picked = "" if cfg.exchange.sync == "powersgd" else " (exchange.sync = auto, with a cluster secret)"
            start = ("waits only for membership to settle (training.start_settle) before its first step"
                     if cfg.training.start_settle > 0 else "steps from its start, alone until others join")
            log.warning("the synchronous mode%s with training.min_peers = 0: this node %s; set training.min_peers "
                        "to the cluster's size less one to start every node together, as DDP's ranks do "
                        "(docs/ALGORITHMS.md)", picked, start)

    def joined(self) -> None:
        self.actor.joined.set()

    async def close(self) -> None:
        await self.actor.close()
