"""How long the daemon's event loop was kept from running: a probe that sleeps a short, fixed
interval and measures how late it wakes.

Everything the daemon does (answering ``/healthz``, SWIM pings and acks, serving models)
waits while one callback holds the loop; model-sized work done on it shows up here as a
stall. The probe costs one wake-up per ``interval``. Its figures are in status
(``event_loop``) and the metrics ``p2pnode_event_loop_lag_seconds`` (a histogram) and
``p2pnode_event_loop_lag_max_seconds`` (the longest since start).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Gauge, Histogram

#: seconds between two wake-ups of the probe
INTERVAL = 0.05
#: a late wake-up at least this long is counted as a stall (the 100 ms budget of a ping's answer)
STALL = 0.1


@dataclass
class LoopLag:
    """The probe's figures; written only by :meth:`run`."""

    histogram: Histogram
    max_gauge: Gauge
    interval: float = INTERVAL
    longest: float = 0.0
    last: float = 0.0
    stalls: int = 0
    samples: int = 0

    def note(self, late: float) -> None:
        """One wake-up ``late`` seconds after it was due."""
        late = max(0.0, late)
        self.samples += 1
        self.last = late
        self.histogram.observe(late)
        if late >= STALL:
            self.stalls += 1
        if late > self.longest:
            self.longest = late
            self.max_gauge.set(late)

    async def run(self) -> None:
        while True:
            due = time.monotonic() + self.interval
            await asyncio.sleep(self.interval)
            self.note(time.monotonic() - due)

    def status(self) -> dict[str, Any]:
        return {"lag_max_s": round(self.longest, 4), "lag_last_s": round(self.last, 4),
                "stalls_over_100ms": self.stalls, "probes": self.samples}
