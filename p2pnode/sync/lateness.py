"""Which nodes the synchronous mode's reducer stops waiting for: the ones that keep coming late.

Daemon side, torch-free. Waiting for every node every step is what makes DDP as slow as its
slowest machine. The reducer (``sync/reducer.py``) notes, for every phase-0 contribution, how
long after the round's first one it came (its lag), and keeps a moving average of each node's
lag and of the time between two rounds. A node whose average lag is over a fifth of a round (and
over ``MIN_LAG``) is *slow*: a round closes without waiting for it, it is in the round only if it
comes before the others have all come, and otherwise it replays the rounds it missed (the
group's steps, not its own: its gradient of that step is dropped, as a backup worker's is in
Chen et al. 2016, *Revisiting Distributed Synchronous SGD*). Once it keeps up again (its lag
falls) it is waited for again. Nodes that come within a few milliseconds of each other (every
node, on a cluster of equal machines) are always waited for, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: weight of the newest lag (and round interval) in the moving averages (about 5 rounds)
ALPHA = 0.2
#: seconds of average lag under which a node is never called slow (4 nodes on 2 cores: 5-13 ms,
#: the reducer's own the most; a node at half speed, waited for: about 30 ms)
MIN_LAG = 0.025
#: rounds before any lag counts (the first steps of a fresh worker are slow, and rounds not yet paced)
WARMUP = 3
#: a node whose average lag is over this share of the average round interval is slow (waiting
#: for it costs the others that much of their pace)
SHARE = 0.2


@dataclass
class Lateness:
    lag: dict[str, float] = field(default_factory=dict)  #: each node's average lag, seconds
    interval: float = 0.0  #: average seconds between two rounds' first contributions
    rounds: int = 0  #: rounds opened
    _last_first: float | None = None

    def round_opened(self, now: float) -> None:
        """A round's first phase-0 contribution came at ``now``."""
        if self._last_first is not None:
            gap = now - self._last_first
            self.interval = gap if self.interval == 0.0 else (1 - ALPHA) * self.interval + ALPHA * gap
        self._last_first = now
        self.rounds += 1

    def came(self, node: str, lag: float) -> None:
        """``node``'s phase-0 contribution came ``lag`` seconds after the first of the round it
        was made for. Not counted in the first rounds; at most two rounds' worth (one stall
        does not make a node slow for long)."""
        if self.rounds < WARMUP:
            return
        lag = min(lag, 2 * self.interval)
        old = self.lag.get(node)
        self.lag[node] = lag if old is None else (1 - ALPHA) * old + ALPHA * lag

    def slow(self) -> set[str]:
        """The nodes not waited for now."""
        limit = max(MIN_LAG, SHARE * self.interval)
        return {n for n, lag in self.lag.items() if lag > limit}
