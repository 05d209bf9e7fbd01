"""What the exchange actor (``exchange/rounds.py``) keeps of its rounds: one ``PeerRecord`` per
peer (the version of our replica of its model, its failures and back-off, what its models
weighed and cost) and the node's ``ExchangeTotals``. Written only by that actor; read by its
status and the consensus finish."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass
class PeerRecord:
    """What this node knows of one peer's exchanges; written only by the exchange actor."""

    addr: str
    epoch: str = ""
    version: int = -1  # version of our replica of the peer's public model; -1: none
    ok: int = 0
    failed: int = 0
    consecutive_failures: int = 0
    bytes_received: int = 0
    last_ok_at: float | None = None
    last_error: str = ""
    last_latency: float | None = None
    #: bytes a second its model bodies came at (EWMA; 0: not measured yet): a fetch's deadline
    #: follows from it (net/deadline.py Transfer)
    rate: float = 0.0
    left_out_until: float = 0.0
    #: ||x - x_hat_peer|| / ||x|| at the last average since our training ended (None: not yet)
    distance: float | None = None
    #: exchanges whose model was clipped to the robust radius (exchange.robust), and whether
    #: the last one was: a peer we clip is not one whose model we should agree with
    clipped: int = 0
    last_clipped: bool = False
    #: models refused as outliers (further than exchange.clip_refuse x the radius)
    outliers: int = 0
    #: our worker could not start this peer's replica from our genesis (wire/genesis.py): ask
    #: for a snapshot from now on
    no_genesis: bool = False

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["left_out"] = self.left_out_until > time.monotonic()
        del out["left_out_until"]
        return out


@dataclass
class ExchangeTotals:
    done: int = 0
    skipped: int = 0
    not_modified: int = 0
    rejected: int = 0
    #: deltas our own worker could not apply (it lost or evicted the replica): snapshot next time
    resyncs: int = 0
    bytes_received: int = 0
    #: exchanges averaged in clipped to the robust radius (exchange.robust = "clip"), and models
    #: refused as outliers (also counted in ``rejected``)
    clipped: int = 0
    outliers: int = 0
    #: of the clipped, those averaged while the node was spread (its typical peer beyond the
    #: refusal bound: nodes that trained apart), which would otherwise have been refused
    spread: int = 0
