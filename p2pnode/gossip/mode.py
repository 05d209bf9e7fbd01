"""Gossip plugged into the daemon: the exchange actor fetches peers' models in the background."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from p2pnode.config import Config
from p2pnode.config.mode_rule import sync_of
from p2pnode.daemon.mode import Mode


class GossipMode(Mode):
    @classmethod
    def chosen(cls, cfg: Config) -> bool:
        return cfg.node.role == "peer" and sync_of(cfg) == "none"

    def actors(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {"exchange": self.parts.exchange.run}
