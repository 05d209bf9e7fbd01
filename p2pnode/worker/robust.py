"""Self-centred clipping of a peer's model before it is averaged in (ClippedGossip).

He, Karimireddy, Jaggi 2022: a node averages not the peer's model but its own moved towards it
by at most a radius tau, ``x <- x + w * clip(x_peer - x, tau)``, so a poisoned peer moves ours
by at most ``w * tau`` an exchange while an honest peer closer than tau is averaged as before.
Ours meet one peer at a time, so tau comes from recent exchanges (``ClipRadius``): relative
distances, a short window per peer, ``factor`` x the lower median over peers, between
``MIN_RATIO`` and ``max_ratio``, so that a hostile minority can shrink tau but not widen it.
Clipping bounds each exchange, not their sum, so a model beyond ``refuse`` x tau is refused as
an *outlier*: at first sight when it is beyond the widest bound too, else on a second strike;
and a node whose typical peer is that far (it trained apart, it is *spread*) refuses nobody and
clips every peer instead. Once the node's own training is over, tau no longer falls below what
it was then (``settle``): finished nodes that agree exactly measure distances of 0, and a tau
at ``MIN_RATIO`` would refuse a peer still training, a late joiner, for doing real work.
docs/ALGORITHMS.md, "Robust averaging", has why each rule is there
and what was measured.

Pure Python, no torch: the torch worker and the stub worker use it alike (``clip_payload``,
``outlier_refusal``, ``applied_clip``: the one rule for both). State lives in the ``ClipRadius``
object, owned by the worker's one thread.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from p2pnode.pipe_protocol import ADOPT, OUTLIER, Applied, PeerPayload

#: the choices of ``exchange.robust``
ROBUST_RULES = ("clip", "none")
#: distances kept per peer, and peers tracked (least recently met forgotten first). A short
#: window: honest distances change 1.5-2x from one exchange to the next during warm-up and at
#: the end of a cosine schedule (measured, 4 nodes on Fashion-MNIST), and a radius that lags
#: them either clips honest peers (rising) or lets a hostile one pull harder (falling)
WINDOW = 3
MAX_PEERS = 64
#: the smallest tau (relative): models once bit-identical (two nodes that agree exactly after
#: training) would record distances of 0 and make tau 0, and 3 x 0 never widens again, so every
#: later difference, a new member's included, would be refused for good. Far below any honest
#: distance measured (0.004 at the end of a cosine schedule)
MIN_RATIO = 1e-4


@dataclass
class ClipDecision:
    """What clipping did to one exchange: ``scale`` multiplies the averaging weight."""

    scale: float
    radius: float  #: tau, relative to ||x||
    refused: bool = False  #: an outlier: not averaged at all
    spread: bool = False  #: the typical peer was as far: averaged clipped instead of refused

    @property
    def clipped(self) -> bool:
        return self.scale < 1.0


@dataclass
class ClipRadius:
    """The adaptive radius tau and the history it comes from (one per worker life)."""

    factor: float = 3.0
    max_ratio: float = 0.25
    refuse: float = 4.0
    window: int = WINDOW
    max_peers: int = MAX_PEERS
    history: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)
    #: each peer's last distances, uncapped (most recently met last): whether the node is spread
    raw: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)
    #: the peers whose last model was beyond ``refuse`` x tau (a strike: the next such is refused)
    struck: OrderedDict[str, bool] = field(default_factory=OrderedDict)
    #: tau when this node's own training ended (0: not yet), its floor from then on (``settle``)
    settled: float = 0.0

    def radius(self) -> float:
        """tau relative to ||x||: factor x the lower median of the peers' medians, at most
        ``max_ratio`` (and that before any history), at least the radius kept by ``settle``."""
        medians = sorted(statistics.median(d) for d in self.history.values() if d)
        if not medians:
            return self.max_ratio
        lower_median = medians[(len(medians) - 1) // 2]
        return min(self.max_ratio, max(MIN_RATIO, self.settled, self.factor * lower_median))

    def settle(self) -> None:
        """This node's training is over: keep tau as it is now as its floor. Why: the consensus
        finish brings finished nodes to the same model, their distances fall towards 0 and tau
        with them, to ``MIN_RATIO`` once they agree exactly; a node that joined late and still
        trains is then as far as training nodes are from each other (0.16 x ||x|| measured on
        Dirichlet-0.1 shards), beyond ``refuse`` x tau, and was refused as an outlier. Kept at
        the radius of training, such a peer is averaged (clipped to it at most), and a hostile
        one moves a finished node by no more than it could while the node trained."""
        if not self.settled:
            self.settled = self.radius()

    def decide(self, peer: str, distance: float) -> ClipDecision:
        """Clip an exchange at relative ``distance`` from ``peer`` (refuse it beyond ``refuse``
        x tau, on a strike: module doc) and record it. A distance that is not a finite non-negative number is refused."""
        tau = self.radius()
        if not (math.isfinite(distance) and distance >= 0):
            return ClipDecision(0.0, tau, refused=True)
        self.record(peer, min(distance, tau))
        remember(self.raw, peer, distance, self.window, self.max_peers)
        spread = self.spread()
        far = distance > self.refuse * tau
        struck = self.struck.pop(peer, False)
        self.struck[peer] = far
        while len(self.struck) > self.max_peers:
            self.struck.popitem(last=False)
        if far and not spread and (struck or distance > self.refuse * self.max_ratio):
            return ClipDecision(0.0, tau, refused=True)
        return ClipDecision(1.0 if distance <= tau else tau / distance, tau, spread=spread)

    def spread(self) -> bool:
        """Whether the typical peer recently met is beyond the widest refusal bound (module doc)."""
        bound = self.refuse * self.max_ratio
        recent = list(self.raw.values())[-2 * self.window:]
        if len(recent) == 1:  # one peer: only once its every recent distance was that far
            return len(recent[0]) == self.window and min(recent[0]) > bound
        latest = sorted(d[-1] for d in recent)
        return bool(latest) and latest[(len(latest) - 1) // 2] > bound

    def record(self, peer: str, distance: float) -> None:
        remember(self.history, peer, distance, self.window, self.max_peers)


def remember(table: OrderedDict[str, deque[float]], peer: str, distance: float, window: int, max_peers: int) -> None:
    """Append to ``peer``'s window, the peer moved to the most recently met end; the least
    recently met forgotten beyond ``max_peers``."""
    recent = table.pop(peer, None) or deque(maxlen=window)
    recent.append(distance)
    table[peer] = recent
    while len(table) > max_peers:
        table.popitem(last=False)


def make_clipper(rule: str, factor: float, max_ratio: float, refuse: float) -> ClipRadius | None:
    """The worker's clipper for ``exchange.robust`` (None: average unclipped, as before)."""
    if rule not in ROBUST_RULES:
        raise ValueError(f"unknown robust averaging rule {rule!r}; choose one of {', '.join(ROBUST_RULES)}")
    return ClipRadius(factor, max_ratio, refuse) if rule == "clip" else None


def clip_payload(clipper: ClipRadius | None, msg: PeerPayload, distance: float,
                 done: bool = False) -> ClipDecision | None:
    """What robust averaging does with a peer's payload at relative ``distance``: None when it
    does not apply (``exchange.robust = "none"``, or an adoption: the bootstrap takes a model
    whole, its checks are the daemon's, p2pnode/exchange/bootstrap.py). ``done``: our own
    training is over (the radius settles: ``ClipRadius.settle``)."""
    if msg.mode == ADOPT or clipper is None:
        return None
    if done:
        clipper.settle()
    return clipper.decide(msg.peer, distance)


def outlier_refusal(clipper: ClipRadius, msg: PeerPayload, clip: ClipDecision, distance: float, epoch: str,
                    version: int) -> Applied:
    """The worker's answer to a payload refused as an outlier; ``epoch`` and ``version`` are the
    replica's, which took the payload (so the peer's next delta applies)."""
    return Applied(token=msg.token, ok=False, peer=msg.peer, reason=OUTLIER, radius=clip.radius,
                   epoch=epoch, version=version,
                   detail=f"its model is {distance:.3g} x ||x|| from ours, over {clipper.refuse:g} x "
                          f"the radius {clip.radius:.3g} (exchange.robust)")


def applied_clip(clip: ClipDecision | None) -> dict[str, Any]:
    """The clipping fields of an averaged payload's ``Applied`` (radius -1: not clipped at all)."""
    return {"radius": clip.radius if clip else -1.0, "clipped": bool(clip and clip.clipped),
            "spread": bool(clip and clip.spread)}
