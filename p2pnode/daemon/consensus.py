"""The consensus finish's bookkeeping: whether a node whose training is over agrees with its
peers, and the evaluation of the model they agreed on (docs/ALGORITHMS.md, "Consensus finish").

The exchange averages and measures; this keeps what the measures say. Kept apart because it is
its own small protocol: agreement is a window of averages within tolerance plus the last
distance to every peer, and reaching it asks the worker for one more evaluation.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.daemon.pipe import WorkerPipe
from p2pnode.pipe_protocol import Evaluate

#: averages within tolerance, in a row, before a node says it agrees with its peers
CONSENSUS_WINDOW = 4


class ConsensusFinish:
    def __init__(self, tolerance: float, metrics: NodeMetrics) -> None:
        self.tolerance = tolerance
        self.metrics = metrics
        #: distances measured at the last averages since training ended
        self.recent: collections.deque[float] = collections.deque(maxlen=CONSENSUS_WINDOW)
        #: averages taken since training ended, and how many there were at the last evaluation
        #: asked for on agreement; whether the last look found agreement
        self.averages_after_done = 0
        self.evaluated_after = 0
        self.agreed = False

    def averaged(self, distance: float) -> None:
        """An average taken after training ended, ``distance`` (relative L2) from our model."""
        self.recent.append(distance)
        self.averages_after_done += 1

    def status(self, done: bool, peers: int, distances: Iterable[float], left_out: int = 0) -> dict[str, Any]:
        """Whether training is over and our model is within tolerance of the peers we average
        with: the last CONSENSUS_WINDOW averages since training ended, and the last one with
        every alive peer measured so far (``distances``: peers left out, dead or clipped do not
        count). A node averages only with the peers its selection graph gives it (two of three
        in a 4-node exponential graph), and agreement along the graph's edges is agreement of
        all: so not every peer needs a measurement. A node with no alive peer is alone and
        agrees; one whose alive peers are all left out (``left_out``: their exchanges failed
        again and again) is not alone, and has not agreed with anybody: not reached, until one
        answers or membership calls them dead."""
        tol = self.tolerance
        known = list(distances)
        worst = max(known) if known else None
        recent = list(self.recent)
        alone = not peers and not left_out
        reached = done and (tol <= 0 or alone or (peers > 0 and (
            len(recent) == CONSENSUS_WINDOW and max(recent) <= tol and (worst or 0.0) <= tol)))
        self.metrics.consensus_distance.set(worst if worst is not None else float("nan"))
        return {"reached": reached, "max_distance": worst, "tolerance": tol, "peers": peers, "left_out": left_out}

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
