"""Adaptive per-peer deadlines: for answers that bring nothing (304, 503), and for the bodies
of answers that bring a model (``Transfer``: a deadline from the body's size and the peer's
measured throughput, and the rate under which a body is cut off).

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
from dataclasses import dataclass


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


#: seconds over which a body's rate is judged: slower than its cut-off rate over any such
#: window, it is cut off (slowloris); a read that brings nothing for as long is too
STALL_WINDOW = 2.0
#: a body may take this many times what the peer's measured rate says it should
SLACK = 4.0
#: a body coming at under 1/CUTOFF of the rate measured from its peer is cut off
CUTOFF = 16.0
#: bodies at least this long measure a peer's throughput (shorter ones measure its latency)
MEASURE_BYTES = 256 * 1024
#: weight of the newest measurement in a peer's throughput estimate
EWMA = 0.3
#: bytes a second a peer is granted to prepare an answer (copy and encode its model, into a
#: file and hashed, wire/served_file.py) before the answer begins: a model's answer may begin
#: later the bigger the model. 50 MB/s left 9 s for a 400 MB snapshot, and a loaded 2-core
#: machine took 10 s to its headers (a fresh clone's CI: the fresh node's bootstrap gave up)
PREPARE_RATE = 20e6


@dataclass(frozen=True)
class Transfer:
    """How long one answer's body may take, once the answer has begun (its headers came within
    the call's timeout): from its size (``Content-Length``, else the largest body allowed) and
    the throughput measured from that peer, between ``floor`` and ``ceiling`` seconds; and the
    rate under which it is cut off whatever its deadline (a peer trickling bytes)."""

    floor: float
    ceiling: float
    min_rate: float  #: bytes/s no body may come slower than (over any STALL_WINDOW)
    rate: float = 0.0  #: bytes/s measured from this peer (0: not yet)

    def first_byte(self, model_bytes: int) -> float:
        """Seconds the answer may take to begin: ``floor``, and a second more for every
        PREPARE_RATE bytes of the model the peer may have to copy and encode first."""
        return min(self.ceiling, self.floor + model_bytes / PREPARE_RATE)

    def deadline(self, nbytes: int) -> float:
        """Seconds a body of ``nbytes`` may take: SLACK times what the peer's rate says, or
        what the slowest rate allowed says before any measurement."""
        rate = self.rate / SLACK if self.rate > 0 else self.min_rate
        expected = nbytes / rate if rate > 0 else self.ceiling
        return min(self.ceiling, max(self.floor, self.floor + expected))

    @property
    def cutoff(self) -> float:
        """Bytes/s under which a body is cut off: far below the peer's measured rate, and
        never under ``min_rate``."""
        return max(self.min_rate, self.rate / CUTOFF)


def update_rate(old: float, nbytes: int, seconds: float) -> float:
    """A peer's throughput estimate (bytes/s, EWMA) after a body of ``nbytes`` in ``seconds``;
    unchanged for a body too short to measure throughput by."""
    if nbytes < MEASURE_BYTES or seconds <= 0:
        return old
    rate = nbytes / seconds
    return rate if old <= 0 else (1 - EWMA) * old + EWMA * rate
