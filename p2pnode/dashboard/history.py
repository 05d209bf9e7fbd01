"""A bounded in-memory history of this node's status, for the dashboard's charts.

``/v1/status`` is a snapshot; a chart needs the past. One small actor samples the status
callable once a second and keeps the last ``capacity`` points (10 minutes by default) in a
deque, so memory is fixed whatever the uptime. Rates (samples/s, bytes/s) are worked out here,
from the difference between two samples, so that every browser sees the same figures and none
has to poll at a fixed pace. Torch-free on purpose: it runs in the daemon's event loop and only
reads the plain dict that ``Node.status()`` builds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("p2pnode.history")

#: points kept: 10 minutes at one a second
DEFAULT_CAPACITY = 600
#: rates are averaged over this many samples back (5 s): a step takes tens of milliseconds and
#: an exchange arrives every few steps, so one-second differences jitter more than they inform
RATE_SPAN = 5


@dataclass(frozen=True)
class Point:
    """One sample of the charts; ``seq`` lets a client ask only for what it has not seen."""

    seq: int
    t: float  # wall-clock time (seconds since the epoch), for the charts' time axis
    step: int
    samples: int
    loss: float | None
    accuracy: float | None
    test_loss: float | None
    samples_per_s: float | None
    bytes_in_per_s: float | None
    bytes_out_per_s: float | None
    exchanges: int


def _finite(value: Any) -> float | None:
    """A number JSON can carry (NaN and infinities are not JSON), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _bytes_in_out(status: dict[str, Any]) -> tuple[int, int]:
    """Everything this node fetched from peers or was sent, and everything it sent to them or
    served (a mode's own routes too: a reducer's contributions and means, pushed gradients)."""
    b = status.get("bytes", {})
    got = int(b.get("client_received", 0)) + int(b.get("routes_received", 0))
    return got, int(b.get("client_sent", 0)) + int(b.get("model_served", 0)) + int(b.get("routes_answered", 0))


class History:
    """The sampler actor (``run``) and its bounded ring of points (``since``)."""

    def __init__(self, status: Callable[[], dict[str, Any]], interval: float = 1.0,
                 capacity: int = DEFAULT_CAPACITY) -> None:
        if interval <= 0 or capacity < 2:
            raise ValueError("history needs interval > 0 and capacity >= 2")
        self.status = status
        self.interval = interval
        self.points: deque[Point] = deque(maxlen=capacity)
        self._seq = 0
        #: the last RATE_SPAN (monotonic time, samples, bytes in, bytes out), oldest first
        self._prev: deque[tuple[float, int, int, int]] = deque(maxlen=RATE_SPAN)

    def sample(self, status: dict[str, Any], now: float | None = None, wall: float | None = None) -> Point:
        """Append one point built from ``status``; rates are over the last RATE_SPAN samples and
        need one before this (else None)."""
        now = time.monotonic() if now is None else now
        t = status.get("training", {})
        samples = int(t.get("samples", 0))
        bytes_in, bytes_out = _bytes_in_out(status)
        if self._prev and samples < self._prev[-1][1]:
            self._prev.clear()  # a restarted worker resumes from its checkpoint: counting starts again
        rates: tuple[float | None, float | None, float | None] = (None, None, None)
        if self._prev and now > self._prev[0][0]:
            t0, s0, in0, out0 = self._prev[0]
            dt = now - t0
            rates = ((samples - s0) / dt, max(0.0, (bytes_in - in0) / dt), max(0.0, (bytes_out - out0) / dt))
        self._prev.append((now, samples, bytes_in, bytes_out))
        self._seq += 1
        point = Point(seq=self._seq, t=round(time.time() if wall is None else wall, 3), step=int(t.get("step", 0)),
                      samples=samples, loss=_finite(t.get("loss")), accuracy=_finite(t.get("accuracy")),
                      test_loss=_finite(t.get("test_loss")),
                      samples_per_s=None if rates[0] is None else round(rates[0], 2),
                      bytes_in_per_s=None if rates[1] is None else round(rates[1], 1),
                      bytes_out_per_s=None if rates[2] is None else round(rates[2], 1),
                      exchanges=int(status.get("exchanges", {}).get("done", 0)))
        self.points.append(point)
        return point

    def since(self, seq: int = 0) -> list[dict[str, Any]]:
        """Points newer than ``seq`` (all of them for 0), oldest first, as JSON-ready dicts."""
        return [asdict(p) for p in self.points if p.seq > seq]

    def to_json(self, seq: int = 0) -> dict[str, Any]:
        return {"interval_s": self.interval, "capacity": self.points.maxlen, "last_seq": self._seq,
                "points": self.since(seq)}

    async def run(self) -> None:
        """Sample once per ``interval`` until cancelled; a failing status read skips one point."""
        while True:
            try:
                self.sample(self.status())
            except Exception:  # status() of a node still being built; never worth stopping the charts
                log.debug("history: status not available", exc_info=True)
            await asyncio.sleep(self.interval)
