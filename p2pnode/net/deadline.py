"""An adaptive per-peer deadline for answers that bring nothing (304, 503).

A peer that answers "nothing new" or "not ready" just before the exchange timeout never
fails, yet costs a whole timeout per round: held by a few such peers, a node's useful
exchanges with honest ones fall to a tenth (hivemind users ask for the same in their issue
#676). So a 304 or 503 slower than ``max(factor x median of the peer's recent useful answer
times, floor)`` counts as a failed exchange (plus ``hold`` for a 304, which an honest server
holds up to ``http.not_modified_hold`` on purpose). The median follows the peer's real speed:
a peer far away, with slow 200s, gets a longer deadline; a peer that never gives a model
gets the floor.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque


class SlowAnswers:
    def __init__(self, factor: float, floor: float, hold: float, window: int = 16, max_peers: int = 1024) -> None:
        self.factor = factor
        self.floor = floor
        self.hold = hold
        self.window = window
        self.max_peers = max_peers
        self._times: OrderedDict[str, deque[float]] = OrderedDict()

    def useful(self, peer: str, seconds: float) -> None:
        """Note the time a useful answer (a model) from ``peer`` took."""
        times = self._times.pop(peer, None) or deque(maxlen=self.window)
        times.append(seconds)
        self._times[peer] = times
        while len(self._times) > self.max_peers:
            self._times.popitem(last=False)

    def deadline(self, peer: str, status: int) -> float:
        """Seconds a ``status`` answer (304 or 503) from ``peer`` may take."""
        times = self._times.get(peer)
        typical = statistics.median(times) if times else 0.0
        return max(self.floor, self.factor * typical) + (self.hold if status == 304 else 0.0)

    def too_slow(self, peer: str, seconds: float, status: int) -> bool:
        return seconds > self.deadline(peer, status)
