"""The small interface the rest of the daemon sees of membership.

Exchange, status and metrics ask only "who is alive" and listen for join / leave / fail
events, so the protocol behind it (simple list exchange, SWIM) can change without them.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from aiohttp import web


#: the largest incarnation a node takes or believes: far from any integer edge (exact as a double,
#: so identity.json survives any JSON reader); claims above it are refused
MAX_INCARNATION = 2**53 - 1
#: addresses saved for the next start (members.json) when the protocol sets no bound of its own
MAX_HINTS = 64


class MemberState(StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@dataclass
class Member:
    node_id: str
    addr: str  # "host:port" of the node's HTTP server
    state: MemberState = MemberState.ALIVE
    incarnation: int = 0
    #: time.monotonic() of the last state change, for "since" in status
    changed_at: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "addr": self.addr, "state": str(self.state),
                "incarnation": self.incarnation}


class EventKind(StrEnum):
    JOIN = "join"
    LEAVE = "leave"
    FAIL = "fail"
    RECOVER = "recover"


@dataclass(frozen=True)
class MemberEvent:
    kind: EventKind
    member: Member


class JoinError(RuntimeError):
    """No seed answered."""


class Membership(abc.ABC):
    """One actor: ``run()`` is its task; everything else is a cheap synchronous read."""

    def __init__(self) -> None:
        self._subscribers: list[asyncio.Queue[MemberEvent]] = []

    @abc.abstractmethod
    def alive_peers(self) -> list[Member]:
        """Members other than this node that exchanges may pick now."""

    @abc.abstractmethod
    def members(self) -> list[Member]:
        """Every known member, this node included, whatever its state."""

    def hints(self) -> list[str]:
        """Addresses worth trying at the next start (saved in members.json): live peers only,
        bounded. They are hints: a node whose hints all fail starts alone."""
        return [m.addr for m in self.alive_peers()][:MAX_HINTS]

    def pusher(self, node_id: str) -> Member | None:
        """The running member ``node_id`` a pushed model may come from (daemon/push.py), or None:
        here an alive peer; SWIM also takes a suspect one (verified members only)."""
        return next((m for m in self.alive_peers() if m.node_id == node_id), None)

    def report_exchange(self, node_id: str, ok: bool) -> None:
        """A hint from the exchange actor; protocols may use or ignore it."""

    @abc.abstractmethod
    def add_routes(self, app: web.Application) -> None:
        """Register the protocol's HTTP endpoints on the node's server."""

    @abc.abstractmethod
    async def join(self, seeds: list[str]) -> None:
        """Contact seeds until one answers; raise JoinError when none did (after retries)."""

    @abc.abstractmethod
    async def run(self) -> None:
        """The protocol loop; runs until cancelled."""

    @abc.abstractmethod
    async def leave(self) -> None:
        """Tell the cluster we leave on purpose (bounded in time)."""

    def subscribe(self) -> asyncio.Queue[MemberEvent]:
        q: asyncio.Queue[MemberEvent] = asyncio.Queue(maxsize=1024)
        self._subscribers.append(q)
        return q

    def _emit(self, kind: EventKind, member: Member) -> None:
        ev = MemberEvent(kind, member)
        for q in self._subscribers:
            if q.full():
                q.get_nowait()  # drop the oldest: a slow listener must not block the protocol
            q.put_nowait(ev)

    def status(self) -> dict[str, Any]:
        return {"members": [m.to_json() for m in self.members()]}
