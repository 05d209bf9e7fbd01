"""The daemon's side of the synchronous mode: it carries the worker's contributions to the
reducer and the means back, and is the reducer when this node has the lowest id.

Daemon side, torch-free. ``POST /v1/sync?phase=P&round=R&from=ID`` (phase 0 or 1 of a step,
2 the models after training) takes a contribution (float16, int8 or
int4 bytes, ``sync/values.py``) from a running member (the push guard's check, ``daemon/push.py``), under the HTTP body
limit, and answers, once the phase closes, with msgpack ``{"round", "count", "included",
"data"}``; 400 for a contribution that cannot be averaged. Every network await is bounded by
``exchange.sync_timeout`` + ``exchange.timeout``: an unreachable reducer makes the worker take
a local step with its own gradient, never wait longer. A node that has not joined yet holds a
contribution until it has (up to ``sync_timeout``; 503 after it), then makes the member
check. A node told its Q factors are old has
missed rounds (it restarted, or joined late): it takes the reducer's model whole (``GET
/v1/model``, adopted as a fresh node adopts a peer's), so it steps on with the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import msgpack
from aiohttp import web

from p2pnode.config import Config
from p2pnode.daemon.pipe import WorkerPipe
from p2pnode.exchange.model_fetch import ModelFetcher
from p2pnode.exchange.rounds import deliver_timeout
from p2pnode.membership.base import Member
from p2pnode.net.client import MSGPACK, PeerClient, PeerError
from p2pnode.net.server import error
from p2pnode.pipe_protocol import ADOPT, Message
from p2pnode.sync.answer import answer
from p2pnode.sync.messages import FINAL, SyncContribute, SyncResult
from p2pnode.sync.outcome import Outcome, SyncRefused
from p2pnode.sync.reducer import MAX_REPLAY, Reducer
from p2pnode.sync.standdown import REST_ROUNDS
from p2pnode.sync.values import resolve

log = logging.getLogger("p2pnode.sync")

#: the route that takes contributions to a reducer (from members only: the push check)
SYNC_PATH = "/v1/sync"
#: seconds a reducer we could not reach is passed over (membership says it is dead soon after)
UNREACHABLE_FOR = 5.0
#: the longest step time a reducer's answer may ask a node to keep (seconds)
MAX_PACE = 60.0
#: seconds after a catch-up before the second one (momentum built again from the same means)
CATCH_UP_AGAIN = 3.0
#: seconds between two catch-ups (a whole model each) of a node that keeps missing rounds
CATCH_UP_EVERY = 10.0
#: the most classes a phase 0's label histogram says (``&classes=``; a task with more says none)
MAX_CLASSES = 256


def parse_classes(text: str) -> list[int] | None:
    """``&classes=N0,N1,...``: a label histogram (None: not said). ValueError: not one."""
    if not text:
        return None
    parts = text.split(",")
    if len(parts) > MAX_CLASSES:
        raise ValueError(f"{len(parts)} counts, at most {MAX_CLASSES}")
    counts = [int(p) for p in parts]  # ValueError for anything but integers
    if any(not 0 <= c < 2**53 for c in counts) or not any(counts):
        raise ValueError("counts are integers from 0 to 2**53, not all 0")
    return counts


class SyncActor:
    def __init__(self, cfg: Config, pipe: WorkerPipe, client: PeerClient, node_id: str,
                 peers: Callable[[], list[Member]], body_limit: Callable[[], int],
                 member_check: Callable[[web.Request], web.StreamResponse | None],
                 classes: Callable[[], list[int]] = list,
                 adaptive: Callable[[], bool | None] = lambda: False) -> None:
        self.cfg = cfg
        self.pipe = pipe
        self.client = client
        self.fetcher = ModelFetcher(client, cfg.exchange)
        self.node_id = node_id
        self.peers = peers  #: the running peers (not us)
        self.body_limit = body_limit
        #: the push guard's check (None: a member's), made here for what came before we joined
        self.member_check = member_check
        #: our node's label histogram (empty: not known), said with each phase 0: the reducer
        #: waits for a slow node whose data is unlike the others' (sync/lateness.py)
        self.classes = classes
        #: whether our worker's optimizer is adaptive (its hello; None before it): exchange.sync_values
        #: = "auto" picks by it
        self.adaptive = adaptive
        #: the last histogram said, and its query-string form (made once a worker life, not a step)
        self._said: tuple[list[int], str] = ([], "")
        #: set once the node has joined: until then a contribution is held (``post``)
        self.joined = asyncio.Event()
        self.reducer = Reducer(cfg.exchange.sync_timeout, self._running, final_wait=cfg.exchange.timeout, me=node_id,
                               wait_for_slow=cfg.exchange.sync_wait_for_slow,
                               stood_down=self._stood_down, values=self._values(),
                               outlier=cfg.exchange.sync_outlier)
        self._tasks: set[asyncio.Task[None]] = set()
        self.totals = {"rounds": 0, "included": 0, "missed": 0, "failures": 0, "refused": 0,
                       "bytes_sent": 0, "bytes_received": 0, "reduced_here": 0, "caught_up": 0,
                       "replayed": 0, "final_count": 0, "stood_down": 0}
        #: of the totals' bytes, those our POST /v1/sync took in and answered (as a reducer): the
        #: dashboard adds them to the HTTP client's own counters
        self.route_bytes = {"received": 0, "answered": 0}
        self._caught_up_at = -CATCH_UP_EVERY
        self.unreachable: dict[str, float] = {}
        #: reducers that stood down (their node is slow): passed over for the rounds before this one
        self.passed_over: dict[str, int] = {}
        self.making = 0  #: the round our last contribution was for
        #: the reducer we took before the current one, (id, address): a node behind the rounds
        #: a new reducer holds asks it for the ones it closed (a reducer that stood down, or the
        #: one that stood in for it)
        self.previous: tuple[str, str] | None = None
        self.current: tuple[str, str] = ("", "")  #: the reducer of our last contribution (id, address)
        self.last_count = 0

    def _classes(self) -> list[int] | None:
        """Our label histogram as phase 0 says it (None: not known, or too long to say)."""
        classes = self.classes()
        return classes if 0 < len(classes) <= MAX_CLASSES else None

    def _classes_query(self) -> str:
        """``&classes=N0,N1,...`` for a phase 0 ("" when we say none). The worker's hello sets
        the histogram once a life: its text is made once too, not at every step."""
        classes = self.classes()
        if classes is not self._said[0]:
            said = self._classes()
            self._said = (classes, f"&classes={','.join(map(str, said))}" if said else "")
        return self._said[1]

    def _values(self) -> str:
        """The values on the wire (exchange.sync_values, "auto" resolved by our worker's optimizer,
        as every node's worker resolves it: sync/values.py ``resolve``)."""
        return resolve(self.cfg.exchange.sync_values, bool(self.adaptive()))

    def _values_unknown(self) -> bool:
        """Whether the values are "auto" and our worker has not yet said (its hello) which
        optimizer it trains with, which decides them; nothing is sent until then."""
        return self.cfg.exchange.sync_values == "auto" and self.adaptive() is None

    def _status_values(self) -> str:
        """What status says of the values (``_values_unknown``: not resolved yet)."""
        if self._values_unknown():
            return "auto (the worker has not said its optimizer yet)"
        return self._values()

    def _stood_down(self) -> set[str]:
        """The reducers passed over at our current round (they stood down: their node is slow)."""
        return {rid for rid, until in self.passed_over.items() if self.making < until}

    def _running(self) -> set[str]:
        return {m.node_id for m in self.peers()} | {self.node_id}

    def reducer_of(self, making: int = 0) -> tuple[str, str]:
        """(id, address) of the reducer we take for round ``making``: the lowest id among the
        running members ("" the address for ours), but not one we could not reach in the last
        UNREACHABLE_FOR seconds (every node finds a dead reducer so at once, and all take the
        same next one before membership says it is dead), nor one that stood down for rounds
        up to ``making`` (every node is told so at the same round, and comes back at the same
        one). None left: ours."""
        now = time.monotonic()
        best: tuple[str, str] | None = None
        for node, addr in [(m.node_id, m.addr) for m in self.peers()] + [(self.node_id, "")]:
            if (self.unreachable.get(node, 0.0) <= now and making >= self.passed_over.get(node, 0)
                    and (best is None or node < best[0])):
                best = (node, addr)
        return best or (self.node_id, "")

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(SYNC_PATH, self.post)

    async def on_message(self, msg: Message) -> None:
        """The supervisor's hook for the worker's messages it does not route itself."""
        if isinstance(msg, SyncContribute):
            task = asyncio.create_task(self._carry(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _carry(self, msg: SyncContribute) -> None:
        outcome = await self._contribute(msg)
        self.last_count = outcome.count
        if msg.phase == FINAL:
            self.totals["final_count"] = outcome.count
        elif msg.phase == 1:
            self.totals["rounds"] += 1
            self.totals["included" if outcome.included else "missed"] += 1
        elif msg.phase == 0 and not outcome.included:
            self.totals["missed"] += 1
            self.totals["replayed"] += len(outcome.replay)
            if outcome.behind:
                self._catch_up()
        try:
            async with asyncio.timeout(self.cfg.exchange.timeout):
                await self.pipe.send(SyncResult(phase=msg.phase, round=outcome.round, data=outcome.data,
                                                count=outcome.count, included=outcome.included,
                                                replay=[list(r) for r in outcome.replay], pace=outcome.pace,
                                                new_group=outcome.new_group))
        except (TimeoutError, ConnectionError):
            pass  # the worker is gone; a new one starts over with the seeded Q

    def _catch_up(self) -> None:
        """Our Q factors were old: we missed rounds (restarted, or joined late), and our model
        lacks their steps. Take a model that has them whole (the reducer's, or when we are the
        reducer the next member's), once in CATCH_UP_EVERY seconds (a failed try does not count)."""
        now = time.monotonic()
        if now - self._caught_up_at < CATCH_UP_EVERY:
            return
        # the reducer that told us: it holds the rounds (not the lowest id, which may be the
        # reducer that just died, its membership not yet dead); we reduce: the next one we can reach
        rid = self.current[0]
        if rid == self.node_id or rid not in {m.node_id for m in self.peers()}:
            others = sorted(m.node_id for m in self.peers() if self.unreachable.get(m.node_id, 0.0) <= now)
            if not others:
                return
            rid = others[0]
        self._caught_up_at = now
        task = asyncio.create_task(self._adopt(rid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _adopt(self, rid: str, again: bool = True) -> None:
        addr = next((m.addr for m in self.peers() if m.node_id == rid), "")
        if not addr:
            return
        try:
            # a model-sized answer: the exchange's deadlines from its size, read off the loop
            resp = await self.fetcher.get(addr, f"/v1/model?from={self.node_id}", self.body_limit(),
                                          4 * self.pipe.params)
            if resp.status != 200:
                raise PeerError(f"HTTP {resp.status}")
            applied = await self.pipe.deliver(rid, resp.body, ADOPT, deliver_timeout(len(resp.body)))
        except (PeerError, TimeoutError, ConnectionError, OSError) as exc:
            log.warning("catching up with %s's model failed: %s", rid, exc)
            if again:  # the first try: told we are behind again, try again in a second, not ten
                self._caught_up_at = time.monotonic() - CATCH_UP_EVERY + 1.0
            return
        if applied.ok:
            self.totals["caught_up"] += 1
            log.info("caught up: took %s's model (we had missed its rounds)", rid)
            if again:
                # our momentum started from nothing and our model lags the others' by the steps
                # it took to build it: once it is built from the same means as theirs, take
                # their model again
                await asyncio.sleep(CATCH_UP_AGAIN)
                await self._adopt(rid, again=False)
        self.totals["bytes_received"] += len(resp.body)

    async def _contribute(self, msg: SyncContribute) -> Outcome:
        out = await self._contribute_once(msg)
        if out is None:  # the reducer was unreachable: once more, through the next one
            out = await self._contribute_once(msg)
        return out if out is not None else Outcome(msg.round, b"", 0, False)

    async def _contribute_once(self, msg: SyncContribute) -> Outcome | None:
        if msg.phase != FINAL:
            self.making = msg.round + 1 if msg.phase == 0 else msg.round
            self._forget_the_past()
        rid, addr = self.reducer_of(self.making)
        if self.current[0] and self.current[0] != rid:
            self.previous = self.current
        self.current = (rid, addr)
        out = await self._through(rid, addr, msg)
        if (out is not None and out.behind and msg.phase == 0 and self.previous is not None
                and self._across_stand_down(rid, self.previous[0])
                and self.unreachable.get(self.previous[0], 0.0) <= time.monotonic()):
            # behind the rounds this reducer holds (new to the role after a stand-down, it has
            # few): the one before it holds the rounds we missed, to replay rather than take a
            # model whole. Only across a stand-down, where every node switched at one round: a
            # switch away from an unreachable reducer happens at each node's own time
            prev = await self._through(*self.previous, msg, replay_only=True)
            if prev is not None and prev.replay:
                return prev
        if out is None or not out.step_down:
            return out
        if not self.making < out.step_down <= self.making + 2 * REST_ROUNDS:
            log.warning("%s stood down until round %d, at our round %d: a local step", rid, out.step_down, self.making)
            self.totals["failures"] += 1
            return Outcome(msg.round, b"", 0, False)
        if rid not in self.passed_over or self.passed_over[rid] != out.step_down:
            log.info("the reducer %s stood down (its node is slow) until round %d: the next one meanwhile",
                     rid, out.step_down)
        self.passed_over[rid] = out.step_down
        self.totals["stood_down"] += 1
        return None  # through the next reducer

    def _forget_the_past(self) -> None:
        """Drop stand-downs no longer read (over, and past the rounds a node could replay across
        them) and unreachable marks run out: kept, both grew by an entry for every reducer a
        long-lived node ever passed over."""
        over = [rid for rid, until in self.passed_over.items() if until + MAX_REPLAY <= self.making]
        for rid in over:
            del self.passed_over[rid]
        now = time.monotonic()
        for rid in [rid for rid, until in self.unreachable.items() if until <= now]:
            del self.unreachable[rid]

    def _across_stand_down(self, rid: str, prev: str) -> bool:
        """Did we leave ``prev`` for ``rid`` at a stand-down: ``prev`` rests now, or ``rid``'s rest
        ended within the last rounds we could still replay?"""
        back = self.passed_over.get(rid)
        return self.making < self.passed_over.get(prev, 0) or (back is not None and 0 <= self.making - back < MAX_REPLAY)

    def _wait(self, phase: int, nbytes: int, addr: str = "") -> float:
        """Seconds a contribution of ``nbytes`` may take to be answered, through the reducer at
        ``addr`` ("": ours). A step's factors: exchange.sync_timeout + exchange.timeout. A model
        after training also waits for the others' models and their mean (Reducer.final_seconds),
        and crosses the link both ways at the rate measured from that peer: a fixed 4 s cut the
        GPT-2 example's 441 MB models off. At most exchange.max_transfer more."""
        x = self.cfg.exchange
        base = x.sync_timeout + x.timeout
        if phase != FINAL:
            return base
        extra = self.reducer.final_seconds(nbytes, len(self.peers()) + 1)
        if addr:
            extra += 2 * self.fetcher.transfer(addr).deadline(nbytes)
        return base + min(extra, max(x.timeout, x.max_transfer))

    async def _through(self, rid: str, addr: str, msg: SyncContribute, replay_only: bool = False) -> Outcome | None:
        """One contribution through reducer ``rid`` (ours when it is us); None: not reached.
        ``replay_only``: ask only for the rounds we missed (``Reducer.replay_for``)."""
        wait = self._wait(msg.phase, len(msg.data), "" if rid == self.node_id else addr)
        if rid == self.node_id and replay_only:
            return self.reducer.replay_for(msg.round)
        if rid == self.node_id:
            try:
                async with asyncio.timeout(wait):
                    self.reducer.values = self._values()
                    out = await self.reducer.contribute(self.node_id, msg.phase, msg.round, msg.data, msg.took,
                                                        self._classes() if msg.phase == 0 else None)
            except (TimeoutError, SyncRefused) as exc:
                log.warning("our own contribution was not averaged: %s", exc or "timeout")
                self.totals["failures"] += 1
                return Outcome(msg.round, b"", 0, False)
            self.totals["reduced_here"] += msg.phase == 1 and not out.step_down
            return out
        path = (f"{SYNC_PATH}?phase={msg.phase}&round={msg.round}&from={self.node_id}&took={msg.took:.4f}"
                + (self._classes_query() if msg.phase == 0 and not replay_only else "")
                + ("&replay=1" if replay_only else ""))
        try:
            # the models' mean after training is as large as our model, whatever the client's default
            resp = await self.client.request("POST", addr, path, b"" if replay_only else msg.data, wait, MSGPACK,
                                             max_body=self.body_limit() + (1 << 20) if msg.phase == FINAL else None)
        except PeerError as exc:  # not reached at all (refused, reset, no answer in time)
            self.totals["failures"] += 1
            self.unreachable[rid] = time.monotonic() + UNREACHABLE_FOR
            log.warning("all-reduce through %s failed (%s): trying the next reducer", rid, exc)
            return None
        self.totals["bytes_sent"] += 0 if replay_only else len(msg.data)
        try:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status} {resp.body[:200]!r}")
            self.totals["bytes_received"] += len(resp.body)
            body = msgpack.unpackb(resp.body, raw=False)
            replay = body.get("replay") or []
            if not isinstance(replay, list) or len(replay) > MAX_REPLAY:
                raise ValueError(f"a replay of {len(replay) if isinstance(replay, list) else '?'} rounds")
            pace = float(body.get("pace") or 0.0)
            if not 0.0 <= pace <= MAX_PACE:  # NaN too: a pace we could not keep is no pace
                raise ValueError(f"pace {pace!r} s")
            return Outcome(int(body["round"]), bytes(body["data"]), int(body["count"]), bool(body["included"]),
                           bool(body.get("behind", False)),
                           [(int(r), bytes(m0), bytes(m1)) for r, m0, m1 in replay], int(body.get("step_down") or 0),
                           pace, bool(body.get("new_group", False)))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("all-reduce through %s failed (%s): a local step", rid, exc)
            self.totals["failures"] += 1
            return Outcome(msg.round, b"", 0, False)

    async def post(self, request: web.Request) -> web.StreamResponse:
        limit = self.body_limit()
        if request.content_length is not None and request.content_length > limit:
            return error(413, f"body over {limit} bytes")
        peer = request.query.get("from", "")
        try:
            phase, rnd = int(request.query.get("phase", "")), int(request.query.get("round", ""))
            took = float(request.query.get("took", "0"))
        except ValueError:
            return error(400, "?phase=0|1&round=N&from=NODE_ID are required (&took=SECONDS a number)")
        if not 0 <= took <= 3600:  # NaN fails too
            return error(400, "took is the seconds a step took: 0 to 3600")
        try:
            classes = parse_classes(request.query.get("classes", ""))
        except ValueError as exc:
            return error(400, f"classes: {exc}")
        if not (0 < len(peer) <= 64 and peer.isprintable()) or phase not in (0, 1, FINAL) or not -2 <= rnd < 2**53:
            return error(400, "?phase=0|1&round=N&from=NODE_ID are required")
        if not self.joined.is_set():
            # a restarted reducer knows only the members that probed it until it has joined: it
            # would refuse the others as strangers (each left to take local steps) and reduce
            # with the rest. Every contribution waits for the join instead, then the member check
            try:
                async with asyncio.timeout(self.cfg.exchange.sync_timeout):
                    await self.joined.wait()
            except TimeoutError:
                return error(503, "not joined yet: this node reduces once it has joined the cluster")
            refusal = self.member_check(request)
            if refusal is not None:
                return refusal
        if self._values_unknown():
            # the values follow our worker's optimizer, known from its hello: a reducer whose
            # worker is still starting would refuse the others' int8 as malformed int4
            try:
                async with asyncio.timeout(self.cfg.exchange.sync_timeout):
                    while self.adaptive() is None:
                        await asyncio.sleep(0.05)
            except TimeoutError:
                return error(503, "this node's worker has not started yet (exchange.sync_values = auto follows "
                                  "its optimizer)")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error(413, f"body over {limit} bytes")
        replay_only = request.query.get("replay", "") == "1"
        if replay_only and phase != 0:
            return error(400, "replay=1 is for phase 0 (the rounds missed since a Q factors' round)")
        try:
            async with asyncio.timeout(self._wait(phase, len(body))):
                self.reducer.values = self._values()  # "auto": known from our worker's hello
                out = (self.reducer.replay_for(rnd) if replay_only
                       else await self.reducer.contribute(peer, phase, rnd, body, took, classes))
        except SyncRefused as exc:
            self.totals["refused"] += 1
            return error(400, f"contribution refused: {exc}")
        except TimeoutError:
            return error(503, "the phase did not close in time")
        resp, sent = answer({"round": out.round, "count": out.count, "included": out.included,
                             "behind": out.behind, "data": out.data, "step_down": out.step_down,
                             "replay": [list(r) for r in out.replay], "pace": out.pace,
                             "new_group": out.new_group})
        # the bodies as they cross the wire, as the contributor counts them and as gossip's are
        self.totals["bytes_received"] += len(body)
        self.totals["bytes_sent"] += sent
        self.route_bytes["received"] += len(body)
        self.route_bytes["answered"] += sent
        return resp

    def status(self) -> dict[str, Any]:
        late, running = self.reducer.late, self._running()
        slow, left_out = late.slow(running), late.left_out(running)
        return {"mode": self.cfg.exchange.sync, "rank": self.cfg.exchange.sync_rank,
                "values": self._status_values(), "reducer": self.current[0],
                # this node's reducer stood down until this round (0: it did not); reducers we pass over
                "resting_until": self.reducer.resting_until, "passed_over": dict(self.passed_over),
                "last_count": self.last_count, "reducer_rounds": self.reducer.rounds,
                # as this node's reducer sees them (empty elsewhere): not waited for, everyone's step time
                "slow": sorted(left_out),
                # slow, but waited for (exchange.sync_wait_for_slow: always, or auto and data unlike the others')
                "waited_for": sorted(slow - left_out),
                "unlike": {n: round(d, 3) for n in sorted(late.classes) if (d := late.unlike(n, running)) is not None},
                "wait_for_slow": self.reducer.wait_for_slow,
                "step_ms": {n: round(v * 1000, 1) for n, v in sorted(late.step.items())},
                # as this node's reducer saw them: contributions taken for outliers (exchange.sync_outlier),
                # by node, and the largest distance of one from its phase's median, in median distances
                "outliers": sum(self.reducer.outliers.by_node.values()),
                "outlier_nodes": dict(sorted(self.reducer.outliers.by_node.items())),
                "largest_distance": round(self.reducer.outliers.largest, 2), **self.totals}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
