"""Which nodes the synchronous mode's reducer stops waiting for: the ones much slower than the rest.

Daemon side, torch-free. Waiting for every node every step is what makes DDP as slow as its
slowest machine. Each node says with its phase-0 contribution how long its step took (from
the last mean it applied to this contribution: its batch, forward and backward; not the
network, so a thin link or the order the reducer answers in does not count), and the reducer
(``sync/reducer.py``) keeps a moving average of it per node. A node whose average is over
``FACTOR`` times the median of the others' (and ``MIN_EXTRA`` over it) is *slow*: a round closes
without waiting for it, it is in the round only if it comes before the others have all come,
and otherwise it replays the rounds it missed (the group's steps, not its own: its gradient of
that step is dropped, as a backup worker's is in Chen et al. 2016, *Revisiting Distributed
Synchronous SGD*). Once it keeps pace again it is waited for again. Machines of about the same
speed (within half again) are always waited for, as before.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

#: weight of the newest step time in the moving averages (about 5 steps)
ALPHA = 0.2
#: a node whose average step is over this many times the others' median is slow (a node at half
#: speed takes twice as long; at 80 %, 1.25 times)
FACTOR = 1.5
#: and at least this many seconds over it (tiny steps jitter by more than half)
MIN_EXTRA = 0.02
#: steps of a node before its times count (a fresh worker's first steps are slow)
WARMUP = 3


@dataclass
class Lateness:
    step: dict[str, float] = field(default_factory=dict)  #: each node's average step time, seconds
    seen: dict[str, int] = field(default_factory=dict)

    def came(self, node: str, took: float) -> None:
        """``node``'s phase-0 contribution says its step took ``took`` seconds (0: not said)."""
        if not took > 0:
            return
        n = self.seen[node] = self.seen.get(node, 0) + 1
        if n <= WARMUP:
            return
        old = self.step.get(node)
        self.step[node] = took if old is None else (1 - ALPHA) * old + ALPHA * took

    def pace(self, node: str, running: set[str] | None = None) -> float:
        """The median of the other nodes' average step times (0.0: none known yet): the step
        time ``node`` is asked to keep (``exchange.sync_keep_pace``)."""
        others = [t for n, t in self.step.items() if n != node and (running is None or n in running)]
        return statistics.median(others) if others else 0.0

    def slow(self, running: set[str] | None = None) -> set[str]:
        """The nodes not waited for now (among ``running``, when given)."""
        times = {n: t for n, t in self.step.items() if running is None or n in running}
        out = set()
        for node, t in times.items():
            others = [v for n, v in times.items() if n != node]
            if others:
                typical = statistics.median(others)
                if t > FACTOR * typical and t - typical > MIN_EXTRA:
                    out.add(node)
        return out
