"""The registry of modes: which daemon side (``p2pnode.daemon.mode.Mode``) a configuration
runs. A new mode is its own folder and one line here (docs/ARCHITECTURE.md, "Modes"); which of
gossip and the synchronous mode ``exchange.sync = "auto"`` runs is p2pnode/config/mode_rule.py's."""

from __future__ import annotations

from p2pnode.config import Config
from p2pnode.config.mode_rule import sync_of
from p2pnode.daemon.mode import Mode
from p2pnode.gossip.mode import GossipMode
from p2pnode.ps.mode import PsServerMode, PsWorkerMode
from p2pnode.sync.mode import SyncMode

#: every mode, the first whose ``chosen(cfg)`` is true runs
MODES: tuple[type[Mode], ...] = (
    SyncMode,
    PsServerMode,
    PsWorkerMode,
    GossipMode,
)


def mode_for(cfg: Config) -> type[Mode]:
    """The mode ``cfg`` asks for (ValueError if none: the config checks make that impossible)."""
    for mode in MODES:
        if mode.chosen(cfg):
            return mode
    raise ValueError(f"no mode for node.role = {cfg.node.role!r} with exchange.sync = {cfg.exchange.sync!r} "
                     f"({sync_of(cfg)!r})")
