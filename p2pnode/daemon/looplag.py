"""How long the daemon's event loop was kept from running: a probe that sleeps a short, fixed
interval and measures how late it wakes.

Everything the daemon does (answering ``/healthz``, SWIM pings and acks, serving models)
waits while one callback holds the loop; model-sized work done on it shows up here as a
stall. The probe costs one wake-up per ``interval``. Its figures are in status
(``event_loop``) and the metrics ``p2pnode_event_loop_lag_seconds`` (a histogram) and
``p2pnode_event_loop_lag_max_seconds`` (the longest since start).

A stall is not always work done on the loop. The longest one is split with the kernel's count
for the loop's thread (``/proc/thread-self/schedstat``): seconds it ran (the loop's own work),
seconds it was ready but waited for a core (a busy machine: the trainers, other daemons), and
the rest, off a core without being ready (its wait for the interpreter lock, which another
thread held, or for a page from disk). Each calls for a different remedy, so status says which.
On a virtual machine the host may also take the machine's cores away ("steal": the whole guest
stalls, and a thread "on a core" or "ready" then was not running at all); the split says how much
of the window the hypervisor took, from ``/proc/stat``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge, Histogram

log = logging.getLogger("p2pnode.node")

#: seconds between two wake-ups of the probe
INTERVAL = 0.05
#: a late wake-up at least this long is counted as a stall (the 100 ms budget of a ping's answer)
STALL = 0.1
#: a stall at least this long is logged (at most once every WARN_EVERY seconds), with its split
WARN = 0.25
WARN_EVERY = 60.0
#: the kernel's per-thread scheduler figures (nanoseconds on a core, waiting for one; slices)
SCHEDSTAT = "/proc/thread-self/schedstat"
#: the machine's CPU times; the 8th figure of its first line is the time the hypervisor took
PROC_STAT = "/proc/stat"
#: the kernel's unit for /proc/stat (USER_HZ: 100 on every Linux architecture p2pnode runs on)
USER_HZ = 100


def _said(split: dict[str, float]) -> str:
    if not split:
        return ""
    return (f": the loop's thread ran {1000 * split['on_cpu_s']:.0f} ms, waited for a core "
            f"{1000 * split['waiting_for_cpu_s']:.0f} ms and was off a core {1000 * split['off_cpu_s']:.0f} ms "
            "(the interpreter lock, the disk) of the probe's last "
            f"{1000 * split['window_s']:.0f} ms"
            + (f"; the hypervisor took {1000 * split['stolen_s']:.0f} ms of the machine's cores meanwhile"
               if split.get("stolen_s") else ""))


def sched_times() -> tuple[float, float] | None:
    """(seconds on a core, seconds ready but waiting for one) of the calling thread so far;
    None where the kernel keeps no such count."""
    try:
        with open(SCHEDSTAT, "rb") as f:
            ran, waited, _ = f.read().split()
        return int(ran) / 1e9, int(waited) / 1e9
    except (OSError, ValueError):
        return None


def stolen() -> float | None:
    """Core-seconds the hypervisor has taken from this machine (all its cores) since boot; None
    where the kernel says nothing of it (not a virtual machine's kernel, or no /proc)."""
    try:
        with open(PROC_STAT, "rb") as f:
            fields = f.readline().split()
        return int(fields[8]) / USER_HZ
    except (OSError, ValueError, IndexError):
        return None


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
    #: the longest stall's window (the probe's sleep and its lateness) split: on a core, ready
    #: but waiting for one, neither (the lock, the disk, or the loop idle in its sleep)
    longest_split: dict[str, float] = field(default_factory=dict)
    #: when a stall was last logged (time.monotonic(); at most one line every WARN_EVERY)
    warned_at: float = -WARN_EVERY
    #: the loop thread's scheduling class: "realtime" or "normal" (``node.loop_priority``)
    scheduling: str = "normal"

    def note(self, late: float, window: float = 0.0, before: tuple[float, float] | None = None,
             after: tuple[float, float] | None = None, steal: float | None = None) -> None:
        """One wake-up ``late`` seconds after it was due; ``before`` and ``after``: the thread's
        :func:`sched_times` around the ``window`` seconds from the sleep to the wake-up;
        ``steal``: the machine's core-seconds the hypervisor took in that window (:func:`stolen`)."""
        late = max(0.0, late)
        self.samples += 1
        self.last = late
        self.histogram.observe(late)
        if late >= STALL:
            self.stalls += 1
        split: dict[str, float] = {}
        if before is not None and after is not None:
            ran, waited = after[0] - before[0], after[1] - before[1]
            split = {"window_s": round(window, 4), "on_cpu_s": round(ran, 4),
                     "waiting_for_cpu_s": round(waited, 4), "off_cpu_s": round(max(0.0, window - ran - waited), 4)}
            if steal is not None:
                split["stolen_s"] = round(max(0.0, steal), 4)
        if late > self.longest:
            self.longest = late
            self.max_gauge.set(late)
            self.longest_split = split
        now = time.monotonic()
        if late >= WARN and now - self.warned_at >= WARN_EVERY:
            self.warned_at = now
            log.warning("the event loop answered nothing for %.0f ms (pings and requests waited)%s",
                        1000 * late, _said(split))

    async def run(self) -> None:
        while True:
            before, steal_before = sched_times(), stolen()
            start = time.monotonic()
            due = start + self.interval
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            # the kernel's figures only for a new longest stall or one to log (a file read, not
            # every wake-up)
            after, steal = None, None
            if now - due > min(self.longest, WARN):
                after, steal_after = sched_times(), stolen()
                if steal_before is not None and steal_after is not None:
                    steal = steal_after - steal_before
            self.note(now - due, now - start, before, after, steal)

    def status(self) -> dict[str, Any]:
        return {"lag_max_s": round(self.longest, 4), "lag_last_s": round(self.last, 4),
                "stalls_over_100ms": self.stalls, "probes": self.samples,
                "lag_max_split": self.longest_split, "scheduling": self.scheduling}
