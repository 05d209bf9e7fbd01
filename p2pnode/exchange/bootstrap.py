"""A fresh node's start from its peers' model, checked (``membership.bootstrap_from_peer``).

A node joining with no checkpoint adopts a peer's public model whole (weight 1, no clipping:
its own is an untrained start). Taken from one peer unchecked, that is the one exchange a
hostile member could poison at will. So the start is a *vote* among up to ``VOTERS`` peers,
each asked for a full snapshot at once:

* a model that is not a valid snapshot (malformed, non-finite: the wire codec refuses both)
  gets no say;
* two models *agree* when ``||a - b|| / min(||a||, ||b||)`` is at most the radius beyond which
  robust averaging refuses a peer outright (``exchange.clip_refuse`` x ``exchange.clip_max``,
  1.0 by default: honest nodes are 0.004-0.27 apart, a sign-flipped model 2, a random one 1.4,
  one scaled by 100 about 99, an all-zero one infinitely far);
* the node adopts the model that agrees with the most others (the nearest of them on a tie),
  if it agrees with at least one: one hostile peer among three, or one among two, cannot
  choose the start. Peers that agree with nobody are named in the log and in status;
* no two agree: no adoption this time; the vote is held again ``RETRY_S`` later (other peers
  may answer, or the honest ones catch up), and after ``MAX_VOTES`` votes the node starts from
  its own model (every node draws the same initial model from ``training.seed``), and robust
  averaging takes it from there;
* a single peer (none other verified within ``LONE_WAIT_S``): adopted unchecked, and status
  says so (``bootstrap.checked`` false).

Until its start is settled the node serves no model (``GET /v1/model`` answers 503, which its
peers skip without counting it against it): an untrained model must not be anyone's start nor
be averaged in. With ``exchange.robust = "none"`` models are only checked to be valid, and the
first valid one is adopted, as before. Limits: two colluding peers serving the same poisoned
model, or a majority of hostile voters, win the vote; the models are decoded here, in the
daemon. A big model's snapshots are spooled to files as they arrive (net/spool.py) and read
from those files mapped (wire/mapped.py): the vote's distances read them through the page cache,
and the chosen one goes to the worker by its file's path. A small model's (under the spool's
size) are held in memory for a moment, up to ``VOTERS`` of them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2pnode.membership.base import Member
from p2pnode.net.client import PeerClient, PeerError
from p2pnode.net.deadline import Transfer
from p2pnode.net.spool import Spool, SpooledBody
from p2pnode.wire.codec import Release, decode
from p2pnode.wire.mapped import MappedBody
from p2pnode.wire.msgview import Body
from p2pnode.wire.payload import PayloadError, Snapshot

log = logging.getLogger("p2pnode.bootstrap")

#: peers asked at once for their model
VOTERS = 3
#: seconds to wait for a second peer to be verified before adopting a lone one unchecked
LONE_WAIT_S = 2.0
#: votes without agreement before the node starts from its own model, and seconds between them
MAX_VOTES = 3
RETRY_S = 2.0
#: seconds from the start during which a vote whose every voter answered 503 (its worker still
#: starting: a big model's takes many seconds to build and publish) is held again, not counted
NOT_READY_S = 120.0


@dataclass
class Offer:
    """One peer's answer to the vote: its snapshot's bytes and values, or why it has no say."""

    peer: Member
    body: Body | SpooledBody = b""
    values: Values | None = None  #: one flat float32 array per tensor (views of ``body``)
    error: str = ""
    latency: float = 0.0  #: seconds the fetch took
    #: a spooled body's file mapped, which ``values`` are views of
    mapped: MappedBody | None = None

    def unmap(self) -> None:
        """The vote is over: let go of the values and the mapping (not of the body's file)."""
        self.values = None
        if self.mapped is not None:
            self.mapped.close()
            self.mapped = None

    def close(self) -> None:
        """Done with this offer: a spooled body's file is removed too."""
        self.unmap()
        if isinstance(self.body, SpooledBody):
            self.body.close()


@dataclass
class Verdict:
    """The vote's outcome: the offer to adopt (None: no agreement), and who agreed with it."""

    chosen: Offer | None
    agreed: list[str] = field(default_factory=list)
    dissent: list[str] = field(default_factory=list)  #: valid models that agreed with nobody
    detail: str = ""


#: a model's values: one flat array, or one per tensor
Values = np.ndarray | list[np.ndarray]
#: elements summed at once in float64 (a big model is never copied whole to compare it)
CHUNK = 1 << 20


class MappedValues(list[np.ndarray]):
    """A snapshot's values that are views of a spooled body's mapping, with what lets a chunk's
    pages go once compared (wire/mapped.py): the vote reads up to ``VOTERS`` big models, and
    holds about a chunk of each resident, not each whole."""

    def __init__(self, arrays: list[np.ndarray], release: Release) -> None:
        super().__init__(arrays)
        self.release = release


def _chunks(v: Values) -> Iterator[np.ndarray]:
    release = v.release if isinstance(v, MappedValues) else None
    for a in [v] if isinstance(v, np.ndarray) else v:
        flat = a.reshape(-1)
        for at in range(0, flat.size, CHUNK):
            yield flat[at:at + CHUNK].astype(np.float64)
            if release is not None:
                release(flat[at:at + CHUNK])


def _sq(v: Values) -> float:
    return sum(float(c @ c) for c in _chunks(v))


def distance(a: Values, b: Values) -> float:
    """||a - b|| relative to the smaller norm: a scaled-up model is as far as it looks. Summed
    in float64 a chunk at a time (two 1.4 GB models compare without a copy of either)."""
    smaller = math.sqrt(min(_sq(a), _sq(b)))
    gap = math.sqrt(sum(float((x - y) @ (x - y)) for x, y in zip(_chunks(a), _chunks(b), strict=True)))
    return gap / smaller if smaller > 0 else (0.0 if gap == 0 else math.inf)


def flat_snapshot(body: Body, max_bytes: int, release: Release | None = None) -> list[np.ndarray]:
    """The values of a snapshot payload, one flat float32 array per tensor (views of ``body``,
    no copy); PayloadError for anything else, non-finite included. ``release``: a mapped body's
    pages go once each tensor is checked (wire/mapped.py)."""
    payload = decode(body, max_bytes=max_bytes, release=release)
    if not isinstance(payload, Snapshot):
        raise PayloadError("not a full snapshot")
    return [np.asarray(payload.tensors[s.name]).reshape(-1) for s in payload.header.specs]


def not_ready(offers: list[Offer]) -> bool:
    """Whether every voter answered 503: none has a model to offer yet."""
    return bool(offers) and all(o.values is None and o.error == "HTTP 503" for o in offers)


def judge(offers: list[Offer], radius: float) -> Verdict:
    """Pick the start among valid offers (see the module's docstring)."""
    valid = [o for o in offers if o.values is not None]
    if not valid:
        return Verdict(None, detail="no peer served a valid model: "
                       + "; ".join(f"{o.peer.node_id}: {o.error}" for o in offers))
    if len(valid) == 1:
        return Verdict(valid[0], detail="one peer only: adopted unchecked")
    if not math.isfinite(radius):  # exchange.robust = "none": the first valid one
        return Verdict(valid[0], detail="not compared (exchange.robust = none)")
    n = len(valid)
    d = [[distance(valid[i].values, valid[j].values) if i != j else 0.0  # type: ignore[arg-type]
          for j in range(n)] for i in range(n)]
    agree = [[j for j in range(n) if j != i and d[i][j] <= radius] for i in range(n)]
    best = max(range(n), key=lambda i: (len(agree[i]), -sum(d[i][j] for j in agree[i])))
    dissent = [valid[i].peer.node_id for i in range(n) if not agree[i]]
    pairs = ", ".join(f"{valid[i].peer.node_id}-{valid[j].peer.node_id} {d[i][j]:.3g}"
                      for i in range(n) for j in range(i + 1, n))
    if not agree[best]:
        return Verdict(None, dissent=dissent, detail=f"no two models within {radius:g} of each other ({pairs})")
    return Verdict(valid[best], agreed=[valid[j].peer.node_id for j in agree[best]], dissent=dissent,
                   detail=f"distances {pairs}")


async def collect(client: PeerClient, peers: list[Member], transfer: Transfer, max_bytes: int,
                  node_id: str, model_bytes: int = 0, model: str = "", spool: Spool | None = None) -> list[Offer]:
    """Ask every peer for its full snapshot at once (naming ourselves: a peer that publishes on
    fetch publishes first for a member), under ``transfer``'s deadlines (a snapshot's size is
    known, the peer's rate not yet); decode each in a thread. ``spool``: big bodies go to files
    there (the caller closes every offer once done: ``Offer.close``)."""

    async def one(peer: Member) -> Offer:
        started = time.monotonic()
        try:
            resp = await client.fetch(peer.addr, f"/v1/model?from={node_id}", transfer.first_byte(model_bytes),
                                      transfer, max_bytes, gzip=False, model=model, spool=spool)
        except PeerError as exc:
            return Offer(peer, error=str(exc))
        latency = time.monotonic() - started
        offer = Offer(peer, resp.payload, latency=latency)
        if resp.status != 200:
            offer.close()
            return Offer(peer, error=f"HTTP {resp.status}")
        try:
            if resp.spooled is not None:
                offer.mapped = await asyncio.to_thread(MappedBody, str(resp.spooled.path))
                values = await asyncio.to_thread(flat_snapshot, offer.mapped.view, max_bytes, offer.mapped.release)
                offer.values = MappedValues(values, offer.mapped.release)
            else:
                offer.values = await asyncio.to_thread(flat_snapshot, resp.body, max_bytes)
        except (PayloadError, OSError) as exc:
            offer.close()
            return Offer(peer, error=str(exc)[:200])
        return offer

    return list(await asyncio.gather(*(one(p) for p in peers)))


@dataclass
class BootstrapState:
    """Where the start stands, for status (``bootstrap``) and the exchange actor."""

    pending: bool
    #: "pending", "adopted" (agreed by other peers), "unchecked" (one peer only), "own" (no
    #: agreement after MAX_VOTES votes, or training ended first: the node's own model), "off"
    #: (not asked, or resumed)
    state: str = "pending"
    source: str | None = None
    agreed: list[str] = field(default_factory=list)
    dissent: list[str] = field(default_factory=list)
    votes: int = 0
    detail: str = ""
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if not self.pending:
            self.state = "off"

    def settle(self, state: str, verdict: Verdict | None = None) -> None:
        self.pending = False
        self.state = state
        if verdict is not None:
            self.source = verdict.chosen.peer.node_id if verdict.chosen else None
            self.agreed, self.dissent, self.detail = verdict.agreed, verdict.dissent, verdict.detail

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "from": self.source, "checked": self.state == "adopted",
                "agreed": self.agreed, "dissent": self.dissent, "votes": self.votes, "detail": self.detail}
