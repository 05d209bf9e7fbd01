"""When the synchronous mode's reducer steps aside: its own node is the slow one.

Daemon side, torch-free. The reducer (``sync/reducer.py``) does not wait for a slow node's
phases; but when the slow machine holds the lowest id, it *is* the reducer, and its daemon, on
the same slow machine, would hold every phase of every round to its pace. So a reducer whose
own node is found slow and not waited for (``sync/lateness.py``: a node whose data is its own
may be waited for) at ``SUSTAIN`` round starts in a row, with every node timed, *stands
down*: it answers every contribution with ``step_down`` R, a round
``REST_ROUNDS`` ahead, and the nodes take the next lowest id for every round before R
(``sync/actor.py``). The rounds are a clock every node shares, so all switch at the same round
and no round is split between two reducers. At R they come back to it: it has forgotten its
rounds and times, measures again, and stands down again if its node is still slow. While it
rests it keeps the rounds it closed, for a node behind them (its own slow one, most likely) to
replay. A false alarm costs nothing but a change of reducer.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pnode.sync.lateness import Lateness

#: round starts in a row that must find our own node slow before we stand down
SUSTAIN = 8
#: rounds a reducer that stood down leaves to the next lowest id before it measures again
REST_ROUNDS = 1000


@dataclass
class StandDown:
    me: str = ""  #: our own node's id ("": never stand down)
    #: we stood down: rounds before this one are the next reducer's (0: we reduce)
    until: int = 0
    #: resting: the last round we closed before we stood down (its rounds are kept to replay)
    kept_round: int | None = None
    run: int = 0  #: round starts in a row that found our own node slow

    def due(self, late: Lateness, running: set[str]) -> bool:
        """At a round start: is it time to stand down (our node slow SUSTAIN times in a row)?"""
        slow = (bool(self.me) and len(running) >= 2 and running <= late.step.keys()
                and self.me in late.left_out(running))
        self.run = self.run + 1 if slow else 0
        return self.run >= SUSTAIN

    def begin(self, making: int, kept_round: int | None) -> int:
        """Stand down as round ``making`` starts, having closed ``kept_round`` last: the round
        from which we reduce again."""
        self.until, self.kept_round, self.run = making + REST_ROUNDS, kept_round, 0
        return self.until

    def end(self) -> None:
        """Our turn again."""
        self.until, self.kept_round, self.run = 0, None, 0
