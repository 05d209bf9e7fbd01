"""The exchange actor: Algorithm 1's "request a peer's model, average it in" step.

After every ``exchange.every`` local steps it picks one alive peer (or
``exchange.peers_per_round``, fetched at once), fetches the peer's public
model with ``GET /v1/model?since=V&epoch=E`` (the sparse delta since the replica we hold) under
``exchange.timeout``, and hands the bytes to the worker, which validates them, updates its replica
and averages. A timeout or error skips the round: the worker never waits for the network, it
only takes what has arrived between two of its steps. With ``exchange.pipeline`` the next
round's fetch starts while the last payload is still waiting for the worker (two rounds at most,
never two with one peer: its next delta builds on the replica the last one updates). A peer that fails ``fail_threshold``
times in a row is left out, then tried again after a back-off, until it answers. A redirect is
a failure (never followed), and so is a 304 or 503 slower than the peer's adaptive deadline
(``exchange.slow_answer``, p2pnode/net/deadline.py): a peer that answers "nothing new" just
before the timeout wastes a round as surely as one that does not answer.

When local training ends (``training.max_samples``) the *consensus finish* begins: no more
local steps, but exchanges go on at a quick pace (``exchange.finish_interval``) until this node's
model is within ``exchange.consensus_tolerance`` (relative L2 distance, measured by the worker
before each average) of every alive peer's, so every node ends with the network's model rather
than one leaning towards its own shard; after that it averages gently, once a second.

The replicas live in the worker, their versions here (``PeerRecord.version``). Whenever the two
may disagree the daemon forgets its versions and asks for snapshots: when a new worker says hello
(a restart loses every replica), and when our worker refuses a delta as a "gap" (no replica, or
another version, of that peer). Both are this node's business, never counted against the peer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from p2pnode.config import Config
from p2pnode.config.adaptive_gossip import peers_per_round
from p2pnode.exchange.bootstrap import (
    LONE_WAIT_S,
    MAX_VOTES,
    NOT_READY_S,
    RETRY_S,
    VOTERS,
    BootstrapState,
    Offer,
    collect,
    judge,
    not_ready,
)
from p2pnode.exchange.consensus import ConsensusFinish
from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.daemon.http import parse_step
from p2pnode.exchange.pace import Pace
from p2pnode.exchange.peer_record import ExchangeTotals, PeerRecord
from p2pnode.daemon.pipe import WorkerPipe
from p2pnode.daemon.state import StepClock
from p2pnode.membership.base import Member, Membership
from p2pnode.membership.selection import PeerSelector
from p2pnode.net.client import DEFAULT_MAX_BODY, PeerClient, PeerError, PeerTimeout
from p2pnode.net.deadline import SlowAnswers, Transfer, update_rate
from p2pnode.net.spool import SPOOL_DIR, Spool, SpooledBody
from p2pnode.pipe_protocol import ADOPT, AVERAGE, GAP, OUTLIER
from p2pnode.wire.codec import payload_limit
from p2pnode.wire.msgview import Body
from p2pnode.wire.payload import ModelSpec

log = logging.getLogger("p2pnode.exchange")

#: seconds between rounds while exchange.max_lead holds our worker (no steps to pace them)
HELD_POLL = 0.1


def deliver_timeout(nbytes: int) -> float:
    """Seconds our worker may take to answer a payload of ``nbytes``: 30, and a second more
    for every 4 MB (a big model's payload crosses the pipe, is checked and applied between two
    of its steps, which are long too; an adopted model is then published whole: a 400 MB one
    took the stub worker 50 s on a loaded 2-core machine). Only a stuck worker runs it out."""
    return 30.0 + nbytes / 4e6


class Exchange:
    def __init__(self, cfg: Config, clock: StepClock, worker: WorkerPipe, membership: Membership,
                 client: PeerClient, metrics: NodeMetrics, node_id: str,
                 genesis: Callable[[], str] = lambda: "",
                 spec: Callable[[], ModelSpec | None] = lambda: None) -> None:
        self.cfg = cfg
        self.clock = clock  # paces the rounds; says when a new worker life began
        self.worker = worker  # takes the fetched payloads
        self.membership = membership
        self.client = client
        self.metrics = metrics
        self.node_id = node_id
        #: the digest of our public model at version 0, "" if this worker life began later
        #: (wire/genesis.py): named in a first fetch, it spares a peer's snapshot
        self.genesis = genesis
        #: our model's tensors (None before our worker's hello): what a peer may send us follows
        #: from it (wire/codec.py payload_limit)
        self.spec = spec
        self.peers: dict[str, PeerRecord] = {}
        self.totals = ExchangeTotals()
        self.selector = PeerSelector(cfg.exchange.peer_selection, node_id, random.Random())
        self.round = 0
        #: slow 304/503 answers count as failures (p2pnode/net/deadline.py)
        self.slow = SlowAnswers(cfg.exchange.slow_answer, cfg.exchange.slow_answer_floor, cfg.http.not_modified_hold)
        # A node joining with no checkpoint adopts a peer model its peers agree on (weight 1):
        # exchange/bootstrap.py. Only a peer exchanges (a ps-worker takes the server's model).
        self.boot = BootstrapState(bool(cfg.node.seeds) and cfg.membership.bootstrap_from_peer
                                   and cfg.node.role == "peer")
        self.bootstrapped_from: str | None = None
        #: agreement after training (exchange/consensus.py)
        self.finish = ConsensusFinish(cfg.exchange.consensus_tolerance, metrics)
        #: the worker life (its epoch) our replica versions belong to
        self.worker_epoch = ""
        #: peers with an exchange in flight: a peer's next delta depends on the last one applied
        self.busy: set[str] = set()
        #: the robust averaging radius tau (relative to ||x||) at the last exchange; None: not yet
        self.clip_radius: float | None = None
        #: whether the last model averaged in was taken under the spread rule (robust.py)
        self.spread = False
        #: exchange.max_lead: peers' steps, and the step our worker may not pass (exchange/pace.py)
        self.pace = Pace(cfg.exchange.max_lead)
        #: where a big fetched body is written as it arrives (net/spool.py), for our worker to
        #: read from: neither process then holds it whole
        self.spool = Spool(Path(cfg.node.state_dir) / SPOOL_DIR)

    def max_body(self) -> int:
        """The largest model answer taken from a peer: the largest payload of our model (capped
        by ``http.max_payload_bytes`` where set), not a constant."""
        spec, override = self.spec(), self.cfg.http.max_payload_bytes
        if spec is None:
            return override or DEFAULT_MAX_BODY
        return payload_limit(spec, override)

    def model_bytes(self) -> int:
        """Our model's float32 bytes (0 before our worker's hello): how long a peer may take to
        begin its answer follows from it (net/deadline.py Transfer.first_byte)."""
        spec = self.spec()
        return 4 * spec.numel if spec is not None else 0

    def fingerprint(self) -> str:
        """Our model's fingerprint ("" before our worker's hello): a peer's answer naming another is
        refused unread, naming both models (net/client.py HEADER_MODEL)."""
        spec = self.spec()
        return spec.fingerprint if spec is not None else ""

    def transfer(self, rec: PeerRecord | None) -> Transfer:
        """A model body's deadline and cut-off rate, from the rate measured from that peer."""
        x = self.cfg.exchange
        return Transfer(x.timeout, max(x.timeout, x.max_transfer), x.min_rate, rec.rate if rec else 0.0)

    def candidates(self, alive: list[Member] | None = None) -> list[Member]:
        """The alive peers (``alive``, or membership's now) not left out after failed exchanges."""
        now = time.monotonic()
        return [p for p in (self.membership.alive_peers() if alive is None else alive)
                if self.peers.get(p.node_id) is None or self.peers[p.node_id].left_out_until <= now]

    async def run(self) -> None:
        await self.clock.ready.wait()
        if self.clock.resumed and self.boot.pending:
            self.boot.settle("off")
        last = self.clock.step
        x = self.cfg.exchange
        # a round is exchange.peers_per_round fetches at once; with exchange.pipeline the next
        # round may start while the last one's payloads are still being applied
        slots = asyncio.Semaphore(2 if x.pipeline else 1)
        async with asyncio.TaskGroup() as rounds:
            while True:
                self.keep_own_if_trained()
                if self.clock.done:
                    # training over: quickly until we agree with every peer, then gently
                    reached = self.consensus()["reached"]
                    await self.finish.evaluate_agreed(reached, self.worker)
                    await asyncio.sleep(1.0 if reached else x.finish_interval)
                else:
                    last = await self.next_round_step(last + x.every - 1)
                    # peers heard from, or silent long enough not to count (a dead one): a new bound
                    await self.pace.tell(self.worker, (p.node_id for p in self.membership.alive_peers()))
                await slots.acquire()
                peers = [p for p in self.candidates() if p.node_id not in self.busy]
                if not peers:
                    slots.release()
                    await asyncio.sleep(0.2)
                    continue
                if self.boot.pending:  # adopt exactly one model, before anything else
                    try:
                        await self.bootstrap(peers)
                    finally:
                        slots.release()
                    continue
                chosen = self.selector.choose_many(peers, self.round, peers_per_round(self.cfg, self.clock.adaptive,
                                                                                       self.clock.params))
                self.round += len(chosen)
                self.busy.update(p.node_id for p in chosen)
                if x.pipeline:
                    rounds.create_task(self._round(chosen, slots))
                else:  # one round at a time, in this task: the paper's (and the default) pacing
                    await self._round(chosen, slots)

    async def _round(self, chosen: list[Member], slots: asyncio.Semaphore) -> None:
        landed = itertools.count(1)  # each payload's place as it lands: the n-th weighs 1/(n+1)
        try:
            await asyncio.gather(*(self.exchange_with(p, landed) for p in chosen))
        finally:
            self.busy.difference_update(p.node_id for p in chosen)
            slots.release()

    async def next_round_step(self, after: int) -> int:
        """The step at which the next round starts: past ``after``, or now if exchange.max_lead
        holds our worker (it takes no step until a round shows the peers caught up)."""
        if not self.pace.enabled:
            return await self.clock.wait_step(after=after)
        while True:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can turn a cancellation
                # arriving as it times out into a TimeoutError, and this loop would swallow it
                # (a node that failed to join then never exited: found by the test suite)
                async with asyncio.timeout(HELD_POLL):
                    return await self.clock.wait_step(after=after)
            except TimeoutError:
                if not self.pace.holds(self.clock.step):
                    continue
                # The bound dates from the last round, from the peers' steps then. They have
                # stepped since (extrapolated at their rates): a node in step is let go here,
                # with no round, so rounds longer than the lead keep their length (a round at
                # once for every hold made exchange.every = 64 a round every ~8 steps).
                await self.pace.tell(self.worker, (p.node_id for p in self.membership.alive_peers()))
                if self.pace.holds(self.clock.step):
                    self.pace.held_seconds += HELD_POLL
                    return self.clock.step

    def follow_worker(self) -> None:
        """A new worker life holds no replicas: forget every version, so the next fetch from
        each peer is a snapshot instead of a delta our worker could only refuse."""
        epoch = self.clock.epoch
        if epoch == self.worker_epoch:
            return
        if self.worker_epoch:
            log.info("new training worker (epoch %s): fetching full models from peers again", epoch)
        self.worker_epoch = epoch
        self.pace.new_worker()
        for rec in self.peers.values():
            rec.version, rec.epoch = -1, ""

    async def exchange_with(self, peer: Member, landed: Iterator[int]) -> bool:
        """One fetch of ``peer``'s model, handed to our worker; ``landed`` numbers this round's
        payloads as they arrive (the n-th is averaged in with weight 1/(n+1))."""
        self.follow_worker()
        rec = self.peers.setdefault(peer.node_id, PeerRecord(peer.addr))
        if rec.addr != peer.addr:  # moved: our replica may be of another life
            rec.addr, rec.version, rec.epoch = peer.addr, -1, ""
        # chain=1: several publishes behind, the deltas as published if smaller than one merged
        # float32 "set" delta (float16 / int8 values stay so); our worker splits them
        # from: who asks, so a peer publishing on fetch publishes first for members only (daemon/http.py)
        genesis = self.genesis() if rec.version < 0 and not rec.no_genesis else ""
        if genesis:  # a first fetch: the delta from version 0 if the peer's is ours (wire/genesis.py)
            query = f"/v1/model?since=0&genesis={genesis}&chain=1&from={self.node_id}"
        elif rec.version < 0:
            query = f"/v1/model?from={self.node_id}"
        else:
            query = f"/v1/model?since={rec.version}&epoch={rec.epoch}&chain=1&from={self.node_id}"
        if self.pace.enabled:  # our step, for the peer's own exchange.max_lead
            query += f"&step={self.clock.step}"
        started = time.monotonic()
        try:
            transfer = self.transfer(rec)
            resp = await self.client.fetch(peer.addr, query, transfer.first_byte(self.model_bytes()), transfer,
                                           self.max_body(), model=self.fingerprint(), spool=self.spool)
        except PeerError as exc:
            if isinstance(exc, PeerTimeout):
                rec.rate /= 2  # a slower peer than measured: its next deadline is longer, its cut-off lower
            self._failed(peer, rec, "timeout" if isinstance(exc, PeerTimeout) else "error", str(exc))
            return False
        latency = time.monotonic() - started
        rec.rate = update_rate(rec.rate, resp.wire_bytes, resp.body_seconds)
        self.metrics.exchange_seconds.observe(latency)
        if (step := parse_step(resp.headers.get("X-P2P-Step", ""))) is not None:
            self.pace.saw(peer.node_id, step)  # the peer's step now (exchange.max_lead)
        rec.last_latency = latency
        if resp.status in (304, 503) and self.slow.too_slow(peer.node_id, latency, resp.status):
            deadline = self.slow.deadline(peer.node_id, resp.status)
            self._failed(peer, rec, "slow", f"HTTP {resp.status} after {latency:.2f} s (deadline {deadline:.2f} s)")
            return False
        if resp.status == 304:
            self._succeeded(peer, rec)
            self.totals.not_modified += 1
            self.metrics.exchanges.labels("not_modified").inc()
            return True
        if resp.status == 503:  # alive, but its worker is (re)starting: not a failure
            self.totals.skipped += 1
            self.metrics.exchanges.labels("unavailable").inc()
            return False
        if resp.status != 200:
            if resp.spooled is not None:
                resp.spooled.close()
            self._failed(peer, rec, "error", f"HTTP {resp.status}")
            return False
        self.slow.useful(peer.node_id, latency - resp.body_seconds)  # the answer's wait, not its size
        return await self._take(peer, rec, resp.payload, nth=next(landed), genesis=bool(genesis),
                                wire=resp.wire_bytes)

    def keep_own_if_trained(self) -> bool:
        """A start not yet taken when training has ended (a short run on a fast machine, peers
        that came late) is not taken at all: our model is trained, and a peer's copy now, an early
        publish maybe, would throw that away. Seen: two of three nodes on skewed shards each took
        the seed's copy of its step ~12 after their 48 steps, left the seed out as an outlier
        from there, and the consensus finish never brought the three together."""
        if not (self.boot.pending and self.clock.done):
            return False
        log.info("bootstrap: training ended before a peer's model was taken; keeping ours")
        self.boot.detail = "training ended first"
        self.boot.settle("own")
        return True

    async def bootstrap(self, peers: list[Member]) -> None:
        """One vote for this fresh node's start (exchange/bootstrap.py); adopts its choice."""
        boot = self.boot
        if len(peers) < 2 and time.monotonic() - boot.started < LONE_WAIT_S:
            await asyncio.sleep(0.2)  # a second peer may be verified any moment: a vote needs two
            return
        self.follow_worker()
        voters = random.sample(peers, min(VOTERS, len(peers)))
        offers = await collect(self.client, voters, self.transfer(None), self.max_body(), self.node_id,
                               self.model_bytes(), self.fingerprint(), self.spool)
        try:
            await self._vote(offers)
        finally:
            for offer in offers:
                offer.close()  # a spooled body's file goes (the chosen one's after the worker took it)

    async def _vote(self, offers: list[Offer]) -> None:
        boot, x = self.boot, self.cfg.exchange
        if self.keep_own_if_trained():  # training ended while the votes came
            return
        # the distances are model-sized work: in a thread
        verdict = await asyncio.to_thread(judge, offers, x.clip_refuse * x.clip_max if x.robust == "clip" else math.inf)
        for offer in offers:
            offer.unmap()  # the values were for the vote; the chosen body goes to the worker by its file
        if not_ready(offers) and time.monotonic() - boot.started < NOT_READY_S:
            await asyncio.sleep(RETRY_S)  # every voter's worker still starting (a big model's takes a while)
            return
        boot.votes += 1
        if verdict.dissent:
            log.warning("bootstrap: the models of %s agree with no other peer's; not taken (%s)",
                        ", ".join(verdict.dissent), verdict.detail)
        if verdict.chosen is None:
            boot.detail = verdict.detail
            if boot.votes >= MAX_VOTES:
                log.warning("bootstrap: no start agreed after %d votes (%s); starting from this node's own model",
                            boot.votes, verdict.detail)
                boot.settle("own", verdict)
            else:
                await asyncio.sleep(RETRY_S)
            return
        offer = verdict.chosen
        rec = self.peers.setdefault(offer.peer.node_id, PeerRecord(offer.peer.addr))
        rec.addr, rec.version, rec.epoch = offer.peer.addr, -1, ""
        if await self._take(offer.peer, rec, offer.body, adopt=True):
            self.metrics.exchange_seconds.observe(offer.latency)  # an exchange done, like any other
            boot.settle("adopted" if verdict.agreed else "unchecked", verdict)
            if not verdict.agreed:
                log.warning("bootstrap: started from %s's model unchecked (%s)", offer.peer.node_id, verdict.detail)
        elif boot.votes >= MAX_VOTES:  # our worker would not take it (another architecture...)
            log.warning("bootstrap: no model taken after %d votes; starting from this node's own", boot.votes)
            boot.settle("own")

    async def _take(self, peer: Member, rec: PeerRecord, body: Body | SpooledBody, adopt: bool = False,
                    nth: int = 1, genesis: bool = False, wire: int | None = None) -> bool:
        """Hand a fetched model to the worker (averaged in, or adopted whole) and book the outcome;
        ``genesis``: an answer to a first fetch that named our genesis (the worker may start the
        peer's replica from its own version 0); ``wire``: the bytes it came in (gzip), if fewer.
        A spooled body's file is removed once the worker has answered (or given up)."""
        try:
            return await self._take_body(peer, rec, body, adopt, nth, genesis, wire)
        finally:
            if isinstance(body, SpooledBody):
                body.close()

    async def _take_body(self, peer: Member, rec: PeerRecord, body: Body | SpooledBody, adopt: bool, nth: int,
                         genesis: bool, wire: int | None) -> bool:
        got = len(body) if wire is None else wire
        rec.bytes_received += got
        self.totals.bytes_received += got
        self.metrics.bytes_received.inc(got)
        try:
            applied = await self.worker.deliver(peer.node_id, body, mode=ADOPT if adopt else AVERAGE, nth=nth,
                                                genesis=genesis, timeout=deliver_timeout(len(body)))
        except (TimeoutError, ConnectionError) as exc:
            # Our own worker is restarting or stopping: the peer did nothing wrong, so this is
            # a skip that does not count against it.
            log.info("payload from %s not applied, our worker did not take it: %r", peer.node_id, exc)
            self.totals.skipped += 1
            self.metrics.exchanges.labels("local").inc()
            rec.version, rec.epoch = -1, ""
            return False
        if not applied.ok and applied.reason == GAP:
            # Our worker has no replica of this peer at that version (it restarted, or evicted
            # it): our own state, not the peer's fault. Resynchronise with a snapshot.
            log.info("replica of %s out of step (%s); fetching a full model next time", peer.node_id, applied.detail)
            rec.no_genesis |= genesis  # a worker without our genesis: snapshots from now on
            self.totals.resyncs += 1
            self.metrics.exchanges.labels("resync").inc()
            rec.version, rec.epoch = -1, ""
            return False
        if not applied.ok and applied.reason == OUTLIER:
            # Robust averaging refused the model as too far from ours (a poisoned peer, most
            # likely): a failure, so a peer that keeps at it is left out. Our replica took it.
            self.totals.rejected += 1
            self.totals.outliers += 1
            rec.outliers += 1
            self._note_clip(rec, False, applied.radius, outlier=True)
            rec.version, rec.epoch = applied.version, applied.epoch
            self._failed(peer, rec, "rejected", f"{applied.reason}: {applied.detail}")
            return False
        if not applied.ok:
            self.totals.rejected += 1
            self._failed(peer, rec, "rejected", f"{applied.reason}: {applied.detail}")
            rec.version, rec.epoch = -1, ""  # ask for a full snapshot next time
            return False
        rec.version, rec.epoch = applied.version, applied.epoch
        self._note_clip(rec, applied.clipped, applied.radius)
        self.totals.spread += applied.spread
        self.spread = applied.spread
        if self.clock.done and applied.distance >= 0 and not applied.clipped:
            rec.distance = applied.distance
            self.finish.averaged(applied.distance, peer.node_id)
        if adopt:
            log.info("started from %s's model (version %d)", peer.node_id, applied.version)
            self.bootstrapped_from = peer.node_id
        self._succeeded(peer, rec)
        self.totals.done += 1
        self.metrics.exchanges.labels("ok").inc()
        return True

    def _note_clip(self, rec: PeerRecord, clipped: bool, radius: float, outlier: bool = False) -> None:
        """Count a clipped exchange (the worker clipped the peer's model to the robust radius);
        an outlier (refused) is not counted here, but marks the peer as one not to agree with."""
        rec.last_clipped = clipped or outlier
        if radius >= 0:
            self.clip_radius = radius
            self.metrics.clip_radius.set(radius)
        if clipped and not outlier:
            rec.clipped += 1
            self.totals.clipped += 1
            self.metrics.clipped.inc()

    def _succeeded(self, peer: Member, rec: PeerRecord) -> None:
        rec.ok += 1
        rec.consecutive_failures = 0
        rec.left_out_until = 0.0
        rec.last_ok_at = time.time()
        self.membership.report_exchange(peer.node_id, True)

    def _failed(self, peer: Member, rec: PeerRecord, result: str, error: str) -> None:
        rec.failed += 1
        rec.consecutive_failures += 1
        rec.last_error = error
        self.totals.skipped += 1
        self.metrics.exchanges.labels(result).inc()
        self.membership.report_exchange(peer.node_id, False)
        threshold = self.cfg.exchange.fail_threshold
        if rec.consecutive_failures >= threshold:
            # Leave it out, then give it one try after a back-off that grows to a minute.
            backoff = min(60.0, 2.0 * 2 ** (rec.consecutive_failures - threshold))
            rec.left_out_until = time.monotonic() + backoff
            if rec.consecutive_failures == threshold:
                log.warning("peer %s (%s) failed %d exchanges in a row; leaving it out: %s",
                            peer.node_id, peer.addr, threshold, error)
        else:
            log.debug("exchange with %s skipped: %s", peer.node_id, error)

    def consensus(self) -> dict[str, Any]:
        """Agreement after training (exchange/consensus.py), with the peers we average with now;
        a peer whose model we clip (poisoned, or far off) is not one to agree with."""
        alive = self.membership.alive_peers()
        peers = self.candidates(alive)
        known = {p.node_id: d for p in peers if p.node_id in self.peers and not self.peers[p.node_id].last_clipped
                 and (d := self.peers[p.node_id].distance) is not None}
        return self.finish.status(self.clock.done, len(peers), known, len(alive) - len(peers))

    def status(self) -> dict[str, Any]:
        return {"totals": dict(self.totals.__dict__), "bootstrapped_from": self.bootstrapped_from,
                "bootstrap": self.boot.status(),
                "peers": {k: v.to_json() for k, v in self.peers.items()}, "consensus": self.consensus(),
                "robust": {"rule": self.cfg.exchange.robust, "radius": self.clip_radius, "spread": self.spread},
                "pace": self.pace.to_json()}
