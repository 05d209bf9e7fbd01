"""The consensus finish's bookkeeping: whether a node whose training is over agrees with its
peers, and the evaluation of the model they agreed on (docs/ALGORITHMS.md, "Consensus finish").

The exchange averages and measures; this keeps what the measures say. Kept apart because it is
its own small protocol: agreement is a window of averages within tolerance plus the last
distance to every peer, and reaching it asks the worker for one more evaluation.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.daemon.pipe import WorkerPipe
from p2pnode.pipe_protocol import Evaluate

#: averages within tolerance, in a row, before a node says it agrees with its peers
CONSENSUS_WINDOW = 4
#: averages since training ended after which a peer's last distance no longer counts: a peer
#: our selection graph no longer gives us (the graph changes as nodes join) is never measured
#: again, and its distance from before would hold agreement off for good
STALE_AFTER = 4 * CONSENSUS_WINDOW
#: seconds since training ended after which a finish that has not agreed ends all the same
#: ("stalled"; the worker's guard then decides whether to keep the merge: worker/finish_guard.py).
#: Why: a peer whose guard refused its merge keeps its own model and averages no more, so peers
#: that kept different models never come within tolerance of each other, and a node averaging
#: with them would exchange at the finish's quick pace for good (seen: a run with one worker
#: restarted from step 0 waited over 10 minutes). Time, not averages: a peer that kept its own
#: model answers 304 (nothing new), which averages nothing. A finish that agrees took 10-40 s
#: (4 nodes, started together or 30 s apart, on the loaded 2-core machine)
STALL_AFTER_S = 120.0


class ConsensusFinish:
    def __init__(self, tolerance: float, metrics: NodeMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.tolerance = tolerance
        self.metrics = metrics
        self._clock = clock
        #: when a look first found training over (None: not yet)
        self.done_since: float | None = None
        #: distances measured at the last averages since training ended
        self.recent: collections.deque[float] = collections.deque(maxlen=CONSENSUS_WINDOW)
        #: averages taken since training ended, and how many there were at the last evaluation
        #: asked for on agreement; whether the last look found agreement
        self.averages_after_done = 0
        self.evaluated_after = 0
        self.agreed = False
        #: each peer's place in the averages after training (``averaged``'s count when last measured)
        self.measured_at: dict[str, int] = {}

    def averaged(self, distance: float, peer: str = "") -> None:
        """An average taken after training ended, ``distance`` (relative L2) from our model,
        with ``peer``'s model."""
        self.recent.append(distance)
        self.averages_after_done += 1
        if peer:
            self.measured_at[peer] = self.averages_after_done

    def fresh(self, distances: Mapping[str, float]) -> list[float]:
        """The peers' last distances measured within the last STALE_AFTER averages (a peer with
        no average counted here counts)."""
        now = self.averages_after_done
        return [d for peer, d in distances.items() if now - self.measured_at.get(peer, now) < STALE_AFTER]

    def status(self, done: bool, peers: int, distances: Iterable[float] | Mapping[str, float],
               left_out: int = 0) -> dict[str, Any]:
        """Whether training is over and our model is within tolerance of the peers we average
        with: the last CONSENSUS_WINDOW averages since training ended, and the last one with
        every alive peer measured so far (``distances``: peers left out, dead or clipped do not
        count). A node averages only with the peers its selection graph gives it (two of three
        in a 4-node exponential graph), and agreement along the graph's edges is agreement of
        all: so not every peer needs a measurement. A node with no alive peer is alone and
        agrees; one whose alive peers are all left out (``left_out``: their exchanges failed
        again and again) is not alone, and has not agreed with anybody: not reached, until one
        answers or membership calls them dead. Given per peer (a mapping), a distance measured more
        than STALE_AFTER averages ago does not count: measured with nodes started 30 s apart, the
        first node's distance to a peer its graph gave it while the others joined stayed 0.023
        (over the tolerance) for good, and its consensus finish never ended."""
        tol = self.tolerance
        known = self.fresh(distances) if isinstance(distances, Mapping) else list(distances)
        worst = max(known) if known else None
        recent = list(self.recent)
        alone = not peers and not left_out
        reached = done and (tol <= 0 or alone or (peers > 0 and (
            len(recent) == CONSENSUS_WINDOW and max(recent) <= tol and (worst or 0.0) <= tol)))
        if done and self.done_since is None:
            self.done_since = self._clock()
        stalled = (done and not reached and self.done_since is not None
                   and self._clock() - self.done_since >= STALL_AFTER_S)
        self.metrics.consensus_distance.set(worst if worst is not None else float("nan"))
        return {"reached": reached or stalled, "stalled": stalled, "max_distance": worst, "tolerance": tol,
                "peers": peers, "left_out": left_out}

    async def evaluate_agreed(self, reached: bool, worker: WorkerPipe) -> None:
        """On reaching agreement, ask the worker for the test-set figures of the model it now
        holds, the one every node ends with. Why: the worker evaluates when its training ends,
        before the consensus finish's averages, so that figure (status, metrics, log) was of
        the node's own model as its shard left it: 0.1-0.6 pt off the agreed one with the
        defaults on skewed shards, 11 points with one class a node (docs/ALGORITHMS.md,
        "Consensus finish"). Asked once each time agreement is reached
        after averages the last figure did not see (a node alone, or with
        ``consensus_tolerance = 0``, averages nothing after training: its figure stands)."""
        if reached and not self.agreed and self.averages_after_done > self.evaluated_after:
            try:
                await worker.send(Evaluate(consensus=True))
            except (ConnectionError, OSError):
                return  # no worker now (restarting): asked again on the next look
            self.evaluated_after = self.averages_after_done
        self.agreed = reached
