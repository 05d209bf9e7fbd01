"""Self-centred clipping of a peer's model before it is averaged in (ClippedGossip).

He, Karimireddy, Jaggi 2022, *Byzantine-robust decentralized learning via ClippedGossip*: a node
averages not the peer's model x_peer but its own model moved towards it by at most a radius tau,

    x <- x + w * clip(x_peer - x, tau),    clip(z, tau) = min(1, tau / ||z||) * z,

so one exchange with a poisoned peer (a sign-flipped, scaled or random model) moves ours by at
most w * tau, while an honest peer closer than tau is averaged exactly as before. Since clip only
scales the difference, it is averaging with a smaller weight: w * min(1, tau / ||x_peer - x||).

The paper's nodes see all their neighbours at once and take tau from their distances (its code
clips to the second largest). Ours meet one peer at a time, so tau comes from the distances of
recent exchanges instead (``ClipRadius``), chosen so that a poisoned peer cannot widen it:

- distances are relative (``||x_peer - x|| / ||x||``): the scale stays put as the model grows;
- each peer keeps its own window of its last few distances (a clipped exchange records tau,
  not its distance, so a peer can raise its own figure by at most ``factor`` per exchange or
  two, which is how an honest peer whose distance really grew is followed);
- tau = ``factor`` x the *lower median*, over the peers seen, of each peer's median: with fewer
  hostile peers than honest ones among those a node averages with, it is an honest peer's figure
  (with two peers, the smaller), so a hostile peer can shrink tau (slowing mixing, never moving
  the model further) but not widen it;
- tau is never above ``max_ratio`` (relative): the radius before any history, and the bound
  whatever the history says; nor below ``MIN_RATIO`` (a tau of 0 could never widen again).

Clipping alone bounds each exchange, not the sum: a peer that sends −x every time pulls ours
towards zero by w * tau per exchange, always the same way, and in a 4-node exponential graph two
of the three honest nodes meet one hostile peer in half their exchanges (measured: sign-flip
with clipping alone, 74 % against 85 % attack-free). So a model further than ``refuse`` x tau is
not averaged at all: the worker refuses it as an *outlier*, which the exchange counts as a
failure, so a peer that keeps sending such models is left out like one that does not answer.
Honest distances grow by less than 2x from one exchange to the next, so with the default 4 an
honest peer is clipped at most, never refused; and since a refusal records tau too, a node whose
every peer looks far (its own model is the odd one) widens tau within a few exchanges.

Not always, measured: an honest copy can jump once (a peer that publishes when fetched,
``compression.publish_on = "fetch"``, serves its last copy when its worker is slow to publish, and
tau may be tiny, 0.003, early on), and a refusal counts against the peer. So a model beyond
``refuse`` x tau is refused at first sight only when it is also beyond the widest bound,
``refuse`` x ``max_ratio`` (every poisoned model measured: sign-flipped 2, random 1.4, scaled far
more); nearer than that it is refused only the second time in a row (a *strike*): the first is
clipped to tau, the ClippedGossip bound, w * tau once. A hostile peer that alternates near and
far gets clipped averages every other exchange: the same bound, never more.

Distance alone cannot tell a peer trained elsewhere from a poisoned one: on label-skewed shards
honest models trained apart (nodes started at different times) are 1.0-1.2 x ||x|| from each
other, beyond the widest refusal bound ``refuse`` x ``max_ratio``, where a random model is (1.4)
and a sign-flipped one (2). What tells them apart is the company: a poisoned model is far from a
node whose other peers are near, while in a cluster that trained apart the typical peer is far.
So a node is *spread* when the lower median over the peers it met recently of each one's last
distance (uncapped, this exchange's included) is beyond ``refuse`` x ``max_ratio``, the bound no
tau can widen past; a spread node refuses nobody and averages every peer clipped to tau
(ClippedGossip's own rule: each exchange moves it by at most w * tau, and honest nodes converge
under it), so nodes that trained apart come together. A node that knows one peer only is spread
when that peer's last ``window`` distances were all that far (a cluster of two that trained
apart), not at first sight. A hostile minority cannot make a node spread: the lower median is an
honest peer's figure, and honest peers near each other are within the bound. A hostile majority
among the peers a node met, or a lone hostile peer met ``window`` times in a row, can: then the
bound is ClippedGossip's w * tau per exchange.

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

    def radius(self) -> float:
        """tau relative to ||x||: factor x the lower median of the peers' medians, at most
        ``max_ratio`` (and that before any history)."""
        medians = sorted(statistics.median(d) for d in self.history.values() if d)
        if not medians:
            return self.max_ratio
        lower_median = medians[(len(medians) - 1) // 2]
        return min(self.max_ratio, max(MIN_RATIO, self.factor * lower_median))

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


def clip_payload(clipper: ClipRadius | None, msg: PeerPayload, distance: float) -> ClipDecision | None:
    """What robust averaging does with a peer's payload at relative ``distance``: None when it
    does not apply (``exchange.robust = "none"``, or an adoption: the bootstrap takes a model
    whole, its checks are the daemon's, p2pnode/daemon/bootstrap.py)."""
    return None if msg.mode == ADOPT or clipper is None else clipper.decide(msg.peer, distance)


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
