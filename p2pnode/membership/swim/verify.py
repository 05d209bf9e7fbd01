"""Members on probation: a claimed node is not a member until it answered us at its address.

Without a cluster secret anyone can reach the membership endpoints and say "node X is alive
at HOST:PORT". Taken on trust, such claims let a stranger fill the member table with ghosts
(every exchange then goes to nobody) or aim the node's model traffic at a third party's
address. So an *alive* claim about a node we do not know, or about a known node at a new
address, only makes it a **candidate**: the node pings the claimed address itself, with the
claimed id as the ping's target, and the candidate becomes a member only on an ack from
exactly that id (a SWIM node acks only pings meant for it). Until then it is nowhere the
rest of the daemon looks: not in the member table, not in ``alive_peers()``, not probed by
the round-robin, not gossiped, not saved in members.json.

``Verifier`` is the bounded waiting room. Every bound refuses rather than grows:

* at most ``max_unverified`` candidates at once, ``max_unverified_per_source`` of them
  offered by one source (the sender's host when the transport knows it, else the claimed
  sender id), one per address (a host:port is one node, so a thousand ids claimed at one
  address cost one probe);
* an address whose probe failed is not probed again for ``verify_retry_after`` seconds;
* the probe loop (swim/membership.py) starts at most ``verify_rate`` probes a second with at most
  ``verify_in_flight`` outstanding, so a flood of claims turns into a trickle of small pings,
  and a ghost that never answers is forgotten within seconds.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from p2pnode.config.swim import SwimConfig

#: addresses remembered as failed (oldest forgotten first beyond this)
MAX_FAILED_REMEMBERED = 4096


@dataclass(frozen=True, slots=True)
class Candidate:
    node: str
    incarnation: int
    addr: str
    source: str


class Verifier:
    """Pending alive claims, in arrival order, with the bounds above; ``run`` paces the probes."""

    def __init__(self, config: SwimConfig) -> None:
        self.config = config
        self._queued: OrderedDict[str, Candidate] = OrderedDict()  # node id -> candidate
        self._probing: dict[str, Candidate] = {}
        self._addrs: set[str] = set()
        self._per_source: Counter[str] = Counter()
        self._failed: OrderedDict[str, float] = OrderedDict()  # addr -> time its probe failed
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queued) + len(self._probing)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._queued or node_id in self._probing

    def pending(self) -> list[Candidate]:
        return list(self._probing.values()) + list(self._queued.values())

    def offer(self, c: Candidate, now: float, per_source: bool = True) -> str | None:
        """Queue ``c`` for its probe; None if queued, else why not (a metrics label).
        ``per_source=False`` for a reply we asked for: the global bound only."""
        if c.node in self or c.addr in self._addrs:
            return "duplicate"
        failed_at = self._failed.get(c.addr)
        if failed_at is not None:
            if now - failed_at < self.config.verify_retry_after:
                return "recently_failed"
            del self._failed[c.addr]
        if len(self) >= self.config.max_unverified:
            return "full"
        if per_source and self._per_source[c.source] >= self.config.max_unverified_per_source:
            return "source_full"
        self._queued[c.node] = c
        self._addrs.add(c.addr)
        self._per_source[c.source] += 1
        self._ready.set()
        return None

    def take(self) -> Candidate | None:
        """The oldest queued candidate, now being probed (``done`` must follow)."""
        if not self._queued:
            self._ready.clear()
            return None
        _, c = self._queued.popitem(last=False)
        self._probing[c.node] = c
        return c

    async def wait(self) -> None:
        """Until something is queued."""
        while not self._queued:
            self._ready.clear()
            await self._ready.wait()

    def done(self, c: Candidate, ok: bool, now: float) -> None:
        """The probe of ``c`` is over; a failure blocks its address for a while."""
        if self._probing.pop(c.node, None) is None:
            return
        self._release(c)
        if not ok:
            self._failed[c.addr] = now
            self._failed.move_to_end(c.addr)
            while len(self._failed) > MAX_FAILED_REMEMBERED:
                self._failed.popitem(last=False)

    def discard(self, node_id: str) -> None:
        """Forget a queued candidate (say, the node became a member another way)."""
        c = self._queued.pop(node_id, None)
        if c is not None:
            self._release(c)

    def clear(self) -> None:
        """Drop everything queued; probes in flight finish and call ``done``."""
        for node_id in list(self._queued):
            self.discard(node_id)

    def _release(self, c: Candidate) -> None:
        self._addrs.discard(c.addr)
        self._per_source[c.source] -= 1
        if self._per_source[c.source] <= 0:
            del self._per_source[c.source]

    async def run(self, probe: Callable[[Candidate], Awaitable[None]],
                  spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        """Start ``probe(candidate)`` for queued candidates, oldest first: at most
        ``verify_rate`` a second and ``verify_in_flight`` at a time (``spawn`` owns the tasks;
        ``probe`` must call ``done``)."""
        slots = asyncio.Semaphore(self.config.verify_in_flight)

        async def one(c: Candidate) -> None:
            try:
                await probe(c)
            finally:
                slots.release()

        while True:
            await self.wait()
            await slots.acquire()
            c = self.take()
            if c is None:
                slots.release()
                continue
            spawn(one(c))
            await asyncio.sleep(1.0 / self.config.verify_rate)
