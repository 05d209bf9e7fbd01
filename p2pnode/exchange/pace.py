"""A bounded lead over the peers (``exchange.max_lead``): a node this many steps ahead of its
peers holds its worker until they catch up.

Why: gossip nodes that run out of step average models from different points of training. In
the study (``scripts/archive/study_desync.py``: 4 nodes on Dirichlet-0.1 shards, each stepping at random
ticks, up to 38 steps apart, as the daemons' histories show them 10–30 apart on a shared
machine) that alone cost 2.5 points (87.36 % in step, 84.83 % out of it), and a lead bounded
at 4 steps gave it back (87.25 %): stale-synchronous parallel (Ho et al. 2013, *More
Effective Distributed ML via a Stale Synchronous Parallel Parameter Server*) between peers.

The reference is the *upper median* of the steps the node's alive peers last reported, each
heard within :data:`FRESH` seconds: with one straggler among three peers (or one of two) the
reference is a peer in step, so a slow or dying node never holds the others back (a node that
stops answering stops counting after FRESH seconds, or when membership declares it dead);
only a node ahead of most of its peers waits; the slowest never does, so nodes cannot hold each
other forever. A peer's step is extrapolated from its last report at its own recent rate, since
reports come a round apart. Steps are heard two ways: the ``X-P2P-Step`` header of every
answer to our fetches (304s included), and the ``step`` a member sends with its fetch of our
model (``GET /v1/model?...&step=``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from p2pnode.pipe_protocol import Hold

if TYPE_CHECKING:
    from p2pnode.daemon.pipe import WorkerPipe

#: seconds a peer's reported step counts for the reference
FRESH = 10.0
#: seconds over which a peer's step rate is measured
RATE_WINDOW = 1.0
#: the bound the worker holds is not known (a new worker life noticed): the next one is sent
UNKNOWN = object()


class Pace:
    """Peers' last reported steps and the step this node may not pass (None: no bound)."""

    def __init__(self, max_lead: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_lead = max_lead
        self._clock = clock
        self._steps: dict[str, tuple[int, float]] = {}  # last report: (step, when)
        self._anchors: dict[str, tuple[int, float]] = {}  # the report each rate is measured from
        self._rates: dict[str, float] = {}  # steps a second, over the last RATE_WINDOW or more
        self.limit: int | None = None
        self.held_seconds = 0.0  #: time the worker spent held (status)
        # the bound the worker holds now (None: none, as every life starts; UNKNOWN: not known)
        self._told: int | None | object = None

    @property
    def enabled(self) -> bool:
        return self.max_lead > 0

    def saw(self, node_id: str, step: int) -> None:
        if not self.enabled or step < 0:
            return
        now = self._clock()
        self._steps[node_id] = (step, now)
        anchor = self._anchors.get(node_id)
        if anchor is None or step < anchor[0]:  # first report, or a restarted peer
            self._anchors[node_id] = (step, now)
            self._rates[node_id] = 0.0
        elif now - anchor[1] >= RATE_WINDOW:
            self._rates[node_id] = (step - anchor[0]) / (now - anchor[1])
            self._anchors[node_id] = (step, now)

    def reference(self, alive: Iterable[str]) -> int | None:
        """The upper median of the fresh steps of ``alive`` peers (None: nobody heard)."""
        now = self._clock()
        alive = set(alive)
        # each peer's step now, extrapolated at its own recent rate from its last report (reports
        # come a round apart: a peer in step would otherwise look a round behind)
        steps = sorted(s + self._rates.get(node, 0.0) * (now - at) for node, (s, at) in self._steps.items()
                       if node in alive and now - at <= FRESH)
        return int(steps[len(steps) // 2]) if steps else None

    def update(self, alive: Iterable[str]) -> int | None:
        """Recompute :attr:`limit` (reference + max_lead) and return it."""
        ref = self.reference(alive) if self.enabled else None
        self.limit = None if ref is None else ref + self.max_lead
        return self.limit

    def new_worker(self) -> None:
        """A new worker life: what it holds is not known, so the next limit is sent whatever it
        is, "none" included. The daemon notices a new life at its first fetch, which comes
        after the first round's Hold went to that worker: taking that for "none" left the
        worker held at that bound for good once every later reference was "none" (its peers'
        steps stale: a big model's rounds are longer than FRESH), since a "none" equal to what
        was told sends nothing and a daemon bounded by nothing never asks again."""
        self._told = UNKNOWN

    async def tell(self, worker: WorkerPipe, alive: Iterable[str]) -> None:
        """Recompute the limit and send the worker a Hold when it changed (``worker``: the
        daemon's WorkerPipe; a worker restarting just misses it and is told on the next round)."""
        if not self.enabled:
            return
        limit = self.update(alive)
        if limit != self._told:
            try:
                await worker.send(Hold(limit=-1 if limit is None else limit))
            except (ConnectionError, OSError):
                return
            self._told = limit

    def holds(self, step: int) -> bool:
        return self.limit is not None and step >= self.limit

    def to_json(self) -> dict[str, object]:
        return {"max_lead": self.max_lead, "limit": self.limit, "held_seconds": round(self.held_seconds, 3),
                "peer_steps": {node: s for node, (s, _) in self._steps.items()}}
