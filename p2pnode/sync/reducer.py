"""The reducer of the synchronous mode: it averages one phase of a step's contributions.

Daemon side, torch-free (numpy). Whichever node the others take for the reducer (the lowest
node id among the running members, ``sync/actor.py``) collects each phase's contributions,
waits until every node it expects has sent one or ``exchange.sync_timeout`` has passed since the
first, and answers every contributor with the same mean, in float16, int8 or int4
(``exchange.sync_values``, ``sync/values.py``). Who it expects: the
members of the last round it closed that are still running (the first round: every running
member). A node that misses a round (dead, slow or restarted) is left out of that round and
expected again from the round after it next tries (turned away as late or with old Q factors,
it is waited for from then on): a dead node costs one timeout, never a hang.

After training, each node sends its whole model (phase 2, float32) and all end with the mean of
them. A node done training is no longer waited for in the others' steps, and the mean waits for
a node a step or a few behind while it still steps (up to ``exchange.timeout`` in all), so a
step count one off at the end costs neither a lonely last step nor a node left out of the mean.

A reducer whose own node is the slow one stands down for a while (``sync/standdown.py``): it
answers every contribution with ``step_down``, and the next lowest id reduces meanwhile.

PowerSGD's two phases are linked: phase 1 (the Q factors) averages only the nodes whose phase 0
(the P factors) was in, and phase 0 counts only contributions made with the Q factors of the
last phase 1 closed (``round`` names it): a node whose Q is older (it missed a round, or
restarted) is answered with the current Q instead, to compute its next step with.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from p2pnode.sync.lateness import POLICIES, Lateness
from p2pnode.sync.messages import FINAL, FINAL_ROUND
from p2pnode.sync.outliers import OutlierCheck
from p2pnode.sync.outcome import Outcome, SyncRefused, parse, wire_kind
from p2pnode.sync.standdown import StandDown
from p2pnode.sync.values import KINDS, encode

log = logging.getLogger("p2pnode.sync")

#: closed phases kept, to answer a late contributor with the means it missed (two a round)
KEEP = 64
#: the most rounds a late node replays (more: it takes a running node's model instead)
MAX_REPLAY = 16
#: contributors one phase takes at most (the rest are refused)
MAX_MEMBERS = 1024
#: bytes a second a whole model is taken to travel at after training (100 Mbit/s): how much
#: longer the models' mean waits for the rest once the first is in (a 441 MB model: 35 s)
FINAL_RATE = 12.5e6
#: bytes a second of all the models together the mean is granted to take (4 models of 500 MB
#: were averaged in 12 s on a loaded 2-core machine: 165 MB/s)
MEAN_RATE = 50e6
#: seconds without a round closed after which a reducer follows a claim of newer Q factors as a
#: fresh one does (it stood in for a reducer that stood down, which has since taken over again)
IDLE_RESET = 1.0


@dataclass
class _Bucket:
    round: int
    expected: set[str]
    parts: dict[str, np.ndarray] = field(default_factory=dict)
    done: asyncio.Future[tuple[bytes, frozenset[str]]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    timer: asyncio.TimerHandle | None = None
    opened: float | None = None  #: loop time of the first timer armed
    new_group: bool = False  #: phase 0, closed: its nodes are not the round before's
    closing: bool = False  #: its mean is being computed in a thread (``Reducer._close``)


#: phases at least this long (values a contribution) are averaged off the event loop
OFF_LOOP = 1 << 20
#: contributions of at least this many bytes are decoded off the event loop (int4 factors of a
#: 124M-parameter model: 1.9 MB, 3.6M values; four of them decoded on the loop stalled it 0.45 s)
OFF_LOOP_BYTES = 256 * 1024

#: nodes timed beyond the running ones before the others are forgotten (``Lateness.keep_only``,
#: checked as a node new to the tables comes: only then do they grow)
FORGET_SLACK = 16


class Reducer:
    def __init__(self, wait: float, running: Callable[[], set[str]], final_wait: float = 0.0, me: str = "",
                 stood_down: Callable[[], set[str]] = set, wait_for_slow: str = "never",
                 values: str = "float16", outlier: float = 0.0) -> None:
        if wait_for_slow not in POLICIES:
            raise ValueError(f"wait_for_slow is one of {', '.join(POLICIES)}, not {wait_for_slow!r}")
        if values not in KINDS:
            raise ValueError(f"values are one of {', '.join(KINDS)}, not {values!r}")
        self.values = values  #: the factors' values on the wire, both ways (exchange.sync_values)
        #: a contribution further from the phase's median than exchange.sync_outlier median
        #: distances is taken as the median (sync/outliers.py)
        self.outliers = OutlierCheck(outlier)
        self.wait = wait
        self.final_wait = final_wait  #: the longest the models' mean waits for a node still training
        self.running = running  #: ids of the running members, ours included
        #: reducers that stood down now (their node slow: sync/actor.py's passed over): a stand-in
        #: does not wait for them before it has timed them itself
        self.stood_down = stood_down
        self.down = StandDown(me)  #: standing down while our own node is slow (sync/standdown.py)
        self._last_close = 0.0  #: loop time of the last phase 1 closed
        self.next_round = 0
        self.q_round: int | None = None  #: the round of the last phase 1 closed (None: none yet)
        self.members: set[str] = set()  #: the last round's phase-0 members
        #: the nodes of the last phase 1 closed: those whose errors that round moved together
        #: (``members``, phase 0's, also gains nodes told they are behind, to be waited for; a
        #: slow node in phase 0 may be left out of phase 1)
        self._last_group: frozenset[str] = frozenset()
        self.open0: _Bucket | None = None
        self.open1: dict[int, _Bucket] = {}
        self.final: _Bucket | None = None
        self.final_result: tuple[bytes, frozenset[str]] | None = None
        self.closed: OrderedDict[tuple[int, int], tuple[bytes, frozenset[str]]] = OrderedDict()
        self.rounds = 0
        #: rounds closed with two nodes or more in them (0: we only ever reduced for one, ours)
        self.shared = 0
        #: each node's step time: a round does not wait for the much slower ones, unless
        #: exchange.sync_wait_for_slow says so (always, or auto for data unlike the others';
        #: one waited for is not stood down for either, when it is our own: sync/lateness.py)
        self.late = Lateness(wait=wait_for_slow)
        #: means being computed in threads (kept referenced until done)
        self._closing: set[asyncio.Task[None]] = set()

    def final_extra(self, nbytes: int) -> float:
        """Seconds the models' mean waits for the rest beyond a step's rule, for models of
        ``nbytes``: each takes a while to arrive (a fixed 2 s left all but the first out of the
        4-node GPT-2 run's mean)."""
        return nbytes / FINAL_RATE

    def final_seconds(self, nbytes: int, members: int) -> float:
        """Seconds a contributor of a model of ``nbytes`` may wait for the models' mean of
        ``members`` nodes, once its model is in: the bucket's wait for the rest and the mean."""
        return max(self.final_wait, self.wait) + self.final_extra(nbytes) + members * nbytes / MEAN_RATE

    @property
    def wait_for_slow(self) -> str:
        """``exchange.sync_wait_for_slow``: never, auto or always."""
        return self.late.wait

    @property
    def resting_until(self) -> int:
        """We stood down: rounds before this one are the next reducer's (0: we reduce)."""
        return self.down.until

    def _not_waited(self, running: set[str]) -> set[str]:
        """The nodes a round does not wait for: the slow ones, and a reducer that stood down
        for being slow until we have timed it ourselves."""
        if self.wait_for_slow == "always":
            return set()
        return self.late.left_out(running) | (self.stood_down() - self.late.step.keys())

    def _fresh(self, keep_closed: bool = False) -> None:
        """Forget every round, as a reducer that has closed none: the next follows on from the
        newest Q factors a contributor holds (standing down, or standing in again). Standing
        down, the rounds closed are kept while we rest: a node behind them (our own slow one,
        most likely) is still answered with them to replay (``contribute``)."""
        self.q_round, self.rounds, self.shared, self.members = None, 0, 0, set()
        self._last_group = frozenset()
        if not keep_closed:
            self.closed.clear()
        self.late.forget_times()
        self.down.run = 0

    def _stands_down(self, making: int, phase: int) -> int:
        """For a contribution to round ``making``: the round from which we reduce again if we
        stand down now or have stood down (0: we reduce this one). Decided only as a round
        starts (a phase 0, none open), so no round is split between two reducers, and not once
        a node has sent us its model after training (the models' mean would be split too)."""
        down = self.down
        if down.until:
            if making < down.until:
                return down.until
            down.end()  # our turn again: measured afresh
            self._fresh()
            return 0
        if (phase != 0 or self.open0 is not None or self.open1 or self.final is not None
                or not down.due(self.late, self.running())):
            return 0  # not between rounds, or training ends (the models' mean has begun here)
        until = down.begin(max(self.next_round, making), self.q_round)
        self._fresh(keep_closed=True)
        return until

    def replay_for(self, q_round: int) -> Outcome:
        """Only the rounds a node holding the Q factors of ``q_round`` missed, to replay (none:
        an empty answer), never a contribution: what a node behind a new reducer's rounds asks
        the reducer before it (``sync/actor.py``). Resting, the rounds we closed before."""
        current = self.down.kept_round if self.down.until else self.q_round
        if current is None or q_round >= current:
            return Outcome(q_round, b"", 0, False)
        return Outcome(current, b"", 0, False, replay=self._replay(q_round, current))

    async def contribute(self, node: str, phase: int, rnd: int, data: bytes, took: float = 0.0,
                         classes: list[int] | None = None) -> Outcome:
        """``took``: phase 0, the seconds the contributor's step took, and ``classes`` its label
        histogram (None: not said): who is slow, and who is waited for all the same (lateness.py)."""
        final = self.final
        if (final is not None and phase != FINAL and node in final.expected and node not in final.parts
                and not final.done.done()):
            # a node still training (its step count behind the others' by a step or a few): the
            # models' mean waits for it while it makes progress, not a fixed time from the first
            self._arm(final, FINAL, restart=True)
        if phase not in (0, 1, FINAL):
            raise SyncRefused(f"phase is 0, 1 or {FINAL}, not {phase}")
        if phase != FINAL or self.resting_until:
            # the round this contribution is for (phase 0 names the Q factors' round, the one before)
            until = self._stands_down(rnd + 1 if phase == 0 else rnd if phase == 1 else self.resting_until - 1, phase)
            if until:
                return Outcome(rnd, b"", 0, False, step_down=until)
        if phase == 0:
            running = self.running()
            new = node not in self.late.seen and node not in self.late.classes
            self.late.came(node, took, classes)
            if new and len(self.late.seen.keys() | self.late.classes.keys()) > len(running) + FORGET_SLACK:
                self.late.keep_only(running | {node})  # nodes gone for good: a long life meets many
            pace = self.late.pace(node, running)
            out = await self._phase0(node, rnd, data)
            out.pace = pace
            return out
        if phase == 1:
            return await self._phase1(node, rnd, data)
        return await self._final(node, data)

    async def _final(self, node: str, data: bytes) -> Outcome:
        """The models at the end of training, averaged once: whatever a node missed on the way
        (a restart, a late round) is evened out, and every node ends with the same model. A
        node that comes after it closed is given it all the same."""
        if self.final_result is not None:
            mean, members = self.final_result
            return Outcome(FINAL_ROUND, mean, len(members), node in members)
        if self.final is None:
            running = self.running()
            self.final = _Bucket(FINAL_ROUND, (self.members & running) or running)
        # a node done training is not waited for in the steps of those still training
        for bucket in [b for b in (self.open0, *self.open1.values()) if b is not None]:
            self._not_waited_in(bucket, node, 0 if bucket is self.open0 else 1)
        return await self._add(self.final, node, data, phase=FINAL)

    def _not_waited_in(self, bucket: _Bucket, node: str, phase: int) -> None:
        """``bucket`` no longer waits for ``node``; it closes if everyone else it waits for is in."""
        bucket.expected.discard(node)
        if bucket.parts and bucket.expected <= bucket.parts.keys():
            self._close(bucket, phase)

    def _done(self) -> set[str]:
        """The nodes that have sent their model after training (no longer step with the rest)."""
        if self.final_result is not None:
            return set(self.final_result[1])
        return set(self.final.parts) if self.final is not None else set()

    async def _phase0(self, node: str, q_round: int, data: bytes) -> Outcome:
        if (self.q_round is not None and q_round > self.q_round and self.open0 is None and not self.open1
                and asyncio.get_running_loop().time() - self._last_close > IDLE_RESET):
            self._fresh()  # we stood in for a while and have been idle since: follow on as a fresh reducer
        elif self.q_round is not None and q_round > self.q_round and self.rounds and not self.shared and not self.open1:
            # every round we closed had one node alone (ours: it came back before the others came
            # back to it, and stepped on its own): those are no group's rounds, theirs are. Drop
            # ours, and follow on from theirs; our own node is behind them and catches up
            if self.open0 is not None:
                self._drop(self.open0)
            self._fresh()
            self.next_round = 0
        if self.q_round is None or (q_round > self.q_round and self.rounds == 0 and not self.open1):
            # a reducer that has closed no round yet (the first, one taking over, or one that
            # restarted): the newest Q factors held are the current ones, and the next round
            # follows on from them; parts made with older ones are dropped. One with rounds of
            # its own (with two nodes or more in them) never jumps ahead for a contributor's claim.
            if self.open0 is not None and self.q_round is not None and q_round > self.q_round:
                self._drop(self.open0)
            self.q_round = q_round
            self.next_round = max(self.next_round, q_round + 1)
        current = self.q_round
        if q_round != current:  # computed with other Q factors: give it the current ones
            if q_round < current:  # behind (not a claim from ahead): wait for it from the next round on
                self.members.add(node)
                replay = self._replay(q_round, current)
                if replay:
                    return Outcome(current, b"", 0, False, replay=replay)
            last = self.closed.get((current, 1))
            self._not_now(node)
            return Outcome(current if last else -1, last[0] if last else b"", 0, False, behind=True)
        if current + 1 < self.next_round:  # the round after it closed its phase 0 without us
            self.members.add(node)
            await self._phase1_closed(self.next_round - 1)  # that round's steps, once there are
            return Outcome(self.q_round, b"", 0, False, replay=self._replay(current, self.q_round))
        bucket = self.open0
        if bucket is None:
            running = self.running()
            expected = ((self.members & running) or running) - self._done() - self._not_waited(running)
            bucket = self.open0 = _Bucket(self.next_round, expected or {node})
        return await self._add(bucket, node, data, phase=0)

    def _not_now(self, node: str) -> None:
        """``node`` was just told it is behind: it cannot make the round open now (it needs
        that round's Q factors first), so the round does not wait for it. A fresh reducer
        expects every running member, its own restarted node too: that round waited out
        ``sync_timeout`` for it, while the node took local steps ahead of the group's count."""
        if self.open0 is not None and node not in self.open0.parts:
            self._not_waited_in(self.open0, node, 0)

    def _replay(self, q_round: int, current: int) -> list[tuple[int, bytes, bytes]]:
        """The means of rounds ``q_round`` + 1 to ``current``, for a node holding the Q factors
        of ``q_round``: stepping along them in order, it takes the steps every node in them
        took, and its model stays theirs (to the bit, if it took no step of its own). Empty when
        it cannot be done: a node with the seeded Q factors (-1: new, or restarted with a model
        of its own) or one more than MAX_REPLAY rounds behind, or a round no longer kept; such
        a node takes a running node's model instead (``behind``)."""
        if q_round < 0 or not 0 < current - q_round <= MAX_REPLAY:
            return []
        out = []
        for rnd in range(q_round + 1, current + 1):
            first, second = self.closed.get((rnd, 0)), self.closed.get((rnd, 1))
            if first is None or second is None:
                return []
            out.append((rnd, first[0], second[0]))
        return out

    async def _phase1_closed(self, rnd: int) -> None:
        """Wait (at most ``wait`` seconds) until round ``rnd``'s phase 1 has closed."""
        first = self.closed.get((rnd, 0))
        if first is None or (rnd, 1) in self.closed:
            return
        bucket = self._bucket1(rnd, first[1])
        try:
            async with asyncio.timeout(self.wait):
                await asyncio.shield(bucket.done)
        except TimeoutError:
            pass

    def _drop(self, bucket: _Bucket) -> None:
        """Answer a bucket's contributors that none of them is in (they take a local step)."""
        if bucket.timer is not None:
            bucket.timer.cancel()
        bucket.parts.clear()
        if not bucket.done.done():
            bucket.done.set_result((b"", frozenset()))
        self.open0 = None

    async def _phase1(self, node: str, rnd: int, data: bytes) -> Outcome:
        if (rnd, 1) in self.closed:
            mean, members = self.closed[(rnd, 1)]
            return Outcome(rnd, mean, len(members), node in members)
        first = self.closed.get((rnd, 0))
        if first is None or node not in first[1]:
            return Outcome(rnd, b"", 0, False)
        return await self._add(self._bucket1(rnd, first[1]), node, data, phase=1)

    def _bucket1(self, rnd: int, members: frozenset[str]) -> _Bucket:
        """Round ``rnd``'s phase 1, open: it waits for the nodes its phase 0 averaged, but not
        for a slow one: a straggler whose phase 0 happened to make the round must not make it
        wait a second time. Late for phase 1, it is answered with the mean all the same and
        drops that step's gradient (``PowerSync.finish``)."""
        bucket = self.open1.get(rnd)
        if bucket is None:
            waited = set(members) - self._done()
            bucket = self.open1[rnd] = _Bucket(rnd, (waited - self._not_waited(self.running())) or waited
                                               or set(members))
        return bucket

    async def _add(self, bucket: _Bucket, node: str, data: bytes, phase: int) -> Outcome:
        length = next(iter(bucket.parts.values())).size if bucket.parts else None
        if len(data) >= OFF_LOOP_BYTES:  # a big model's factors, or a whole model: decoded and checked in a thread
            arr = await asyncio.to_thread(parse, data, length, wire_kind(phase, self.values))
            if bucket.done.done() or bucket.closing:  # closed while we decoded: answered, not in it
                mean, members = await asyncio.shield(bucket.done)
                return Outcome(bucket.round, mean, len(members), node in members, new_group=bucket.new_group)
        else:
            arr = parse(data, length, wire_kind(phase, self.values))
        if node not in bucket.parts and len(bucket.parts) >= MAX_MEMBERS:
            raise SyncRefused(f"a round takes at most {MAX_MEMBERS} nodes")
        bucket.parts[node] = arr
        if bucket.expected <= bucket.parts.keys():
            self._close(bucket, phase)
        elif bucket.timer is None:
            self._arm(bucket, phase)
        mean, members = await asyncio.shield(bucket.done)
        return Outcome(bucket.round, mean, len(members), node in members, new_group=bucket.new_group)

    def _arm(self, bucket: _Bucket, phase: int, restart: bool = False) -> None:
        """Close ``bucket`` ``wait`` seconds from now without the nodes still missing (the
        models' mean, restarted while a node still trains, at most ``final_wait`` seconds after
        its first model: its contributors wait no longer than that for the answer)."""
        loop = asyncio.get_running_loop()
        if bucket.timer is not None:
            if not restart:
                return
            bucket.timer.cancel()
        if bucket.opened is None:
            bucket.opened = loop.time()
        delay = self.wait
        if phase == FINAL:
            extra = self.final_extra(4 * next(iter(bucket.parts.values())).size) if bucket.parts else 0.0
            delay = max(0.0, min(delay + extra, bucket.opened + max(self.final_wait, self.wait) + extra - loop.time()))
        bucket.timer = loop.call_later(delay, self._close, bucket, phase)

    def _close(self, bucket: _Bucket, phase: int) -> None:
        if bucket.done.done() or bucket.closing:
            return
        if bucket.timer is not None:
            bucket.timer.cancel()
        names = sorted(bucket.parts)
        parts = [bucket.parts[name] for name in names]
        kind = wire_kind(phase, self.values)
        if parts[0].size < OFF_LOOP:
            self._closed(bucket, phase, names, self._mean(names, parts, bucket.round, phase, kind))
            return
        # a long phase (factors of a big model, the models' mean after training: seconds of numpy
        # at 124M parameters) is averaged in a thread: the loop answers pings, acks and requests
        # meanwhile. Contributions that come while it runs wait for the same answer, not in it.
        bucket.closing = True
        task = asyncio.get_running_loop().create_task(self._close_in_thread(bucket, phase, names, parts, kind))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _mean(self, names: list[str], parts: list[np.ndarray], rnd: int, phase: int, kind: str) -> bytes:
        """The phase's mean as ``kind`` bytes. Summed in float64, so the order does not matter:
        node ids are random, and summed in float32 in their sorted order two runs of one seed
        went apart (tests/sync/test_reducer.py). Float16 parts sum exactly (each a multiple of
        2**-24 below 2**16: up to 8192 of them fit float64's 53 bits), int8 and int4 parts nearly
        so (each a 7- or 3-bit value times a float32 scale: 31 bits), the models' float32 mean
        nearly so. Slice by slice (sync/outliers.py ``mean_in_chunks``); a float32 mean is kept
        in float32 (what it is rounded to on the wire anyway)."""
        mean = self.outliers.mean(names, parts, rnd, phase, np.float32 if kind == "float32" else np.float64)
        if kind == "float32" and mean.dtype == np.dtype("<f4"):
            return mean.tobytes()  # what encode gives, without its copy
        return encode(mean, kind)

    async def _close_in_thread(self, bucket: _Bucket, phase: int, names: list[str], parts: list[np.ndarray],
                               kind: str) -> None:
        try:
            mean = await asyncio.to_thread(self._mean, names, parts, bucket.round, phase, kind)
        except Exception:  # noqa: BLE001 - never leave the contributors waiting on a mean
            log.exception("round %d phase %d: the mean could not be computed", bucket.round, phase)
            bucket.closing = False
            if bucket is self.open0:
                self._drop(bucket)
            elif not bucket.done.done():
                bucket.done.set_result((b"", frozenset()))
            return
        if not bucket.done.done():  # not dropped meanwhile
            self._closed(bucket, phase, names, mean)

    def _closed(self, bucket: _Bucket, phase: int, names: list[str], mean: bytes) -> None:
        """A phase's mean is known: record it, move the rounds on, answer its contributors."""
        if bucket.timer is not None:
            bucket.timer.cancel()
        members = frozenset(names)
        if phase == FINAL:
            self.final_result = (mean, members)
        else:
            self.closed[(bucket.round, phase)] = (mean, members)
            while len(self.closed) > KEEP:
                self.closed.popitem(last=False)
        if phase == 0:
            self.open0 = None
            bucket.new_group = members != self._last_group
            self.members = set(members)
            self.next_round = bucket.round + 1
        elif phase == 1:
            self.open1.pop(bucket.round, None)
            self.q_round = bucket.round
            self.rounds += 1
            self.shared += len(members) > 1
            self._last_close = asyncio.get_running_loop().time()
            self._last_group = members
        bucket.parts.clear()
        bucket.done.set_result((mean, members))
