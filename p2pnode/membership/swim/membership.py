"""``SwimMembership``: the SWIM + Lifeguard actor, modelled on HashiCorp memberlist.

``run()`` is one TaskGroup of four loops:

* probe: every ``probe_interval`` (times the local health multiplier) ping the next member
  of a shuffled round-robin; without an ack within ``probe_timeout``, ask
  ``indirect_checks`` helpers to ping it (ping-req; they answer ack or nack) while retrying
  directly; no ack by the end of the period: suspect it, and tell it first (buddy rule);
* gossip: every ``gossip_interval``, while updates are queued, push them to
  ``gossip_nodes`` random members (recently dead ones included, so they can refute);
* push-pull: every ``push_pull_interval`` swap full state with a random live member, and
  with a random dead one, which repairs partitions once they heal;
* reap: forget long-dead members and old tombstones;
* verify: ping proposed members at their claimed address (verify.py), a few at a time.

Inbound requests arrive through the transport (HTTP routes, or the simulator) at
``handle``. Everything protocol-level without I/O lives in core.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from p2pnode.membership.base import JoinError, Member
from p2pnode.config.swim import SwimConfig
from p2pnode.membership.swim.core import SwimCore
from p2pnode.membership.swim.messages import (Ack, Alive, Gossip, Message, MessageError, Nack, Ping, PingReq,
                                              PushPull, Suspect, decode, encode)
from p2pnode.membership.swim.metrics import SwimMetrics
from p2pnode.membership.swim.state import ALIVE, DEAD, SUSPECT
from p2pnode.membership.swim.transport import HttpTransport, Transport
from p2pnode.membership.swim.verify import Candidate
from p2pnode.net.client import PeerClient, PeerError

log = logging.getLogger("p2pnode.membership.swim")


class SwimMembership(SwimCore):
    def __init__(self, node_id: str, addr: str, client: PeerClient | None, config: SwimConfig | None = None,
                 incarnation: int = 0, registry: CollectorRegistry | None = None,
                 on_incarnation: Callable[[int], None] | None = None, *, transport: Transport | None = None,
                 rng: random.Random | None = None) -> None:
        config = config or SwimConfig.lan()
        rng = rng or random.Random()
        super().__init__(node_id, addr, config, incarnation, SwimMetrics(registry), rng, on_incarnation)
        if transport is None:
            if client is None:
                raise ValueError("SwimMembership needs a PeerClient or a transport")
            transport = HttpTransport(client)
        self.transport = transport
        transport.bind(self.handle, observer=self.metrics.observe, max_message_bytes=config.max_message_bytes,
                       max_push_pull_bytes=config.max_push_pull_bytes)
        self._seq = itertools.count(rng.getrandbits(32))
        self._seeds: list[str] = []
        self._tg: asyncio.TaskGroup | None = None
        self._gossip_in_flight = 0

    # --- plumbing --------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        self.transport.add_routes(app)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Fire-and-forget work, owned by run()'s TaskGroup (dropped when not running)."""
        if self._tg is None:
            coro.close()
            return
        self._tg.create_task(coro)

    async def _request(self, addr: str, msg: Message, timeout: float) -> Message | None:
        """Send one message; the decoded reply, or None if it failed in any way."""
        try:
            reply = await self.transport.send(addr, encode(msg), timeout)
            return decode(reply)
        except PeerError as exc:
            log.debug("%s to %s failed: %s", type(msg).__name__, addr, exc)
        except MessageError as exc:
            log.warning("bad reply from %s: %s", addr, exc)
        return None

    # --- inbound ---------------------------------------------------------------------------

    async def handle(self, obj: dict[str, Any], origin: str | None = None) -> dict[str, Any]:
        """Serve one request (already a msgpack map); MessageError on malformed input.

        ``origin`` (the sender's host, when the transport knows it) is what per-source bounds
        count; the sender id in the message is only a claim.
        """
        msg = decode(obj)
        if isinstance(msg, PushPull):
            # merge first, so our reply carries any refutation
            self.merge(msg.members, msg.sender, self.intake(msg.sender, origin))
            return encode(PushPull(self.node_id, False, self.records()))
        if isinstance(msg, (Ack, Nack)):
            raise MessageError(f"{type(msg).__name__} is a reply, not a request")
        src = self.intake(msg.sender, origin)
        if isinstance(msg, Ping):
            if msg.target != self.node_id:
                raise MessageError(f"ping for {msg.target!r} reached {self.node_id!r}")
            self.accept(Alive(msg.sender, msg.sender_incarnation, msg.sender_addr), src)  # it introduces itself
            self.receive(msg.updates, src)
            return encode(Ack(msg.seq, self.node_id, self.piggyback(msg.sender, known=msg.updates)))
        self.receive(msg.updates, src)
        if isinstance(msg, PingReq):
            # only for members: a stranger must not make us ping whatever address it names
            timeout = min(self.config.probe_timeout, 0.8 * msg.timeout_ms / 1000.0)
            acked = (src.from_member and msg.target != msg.sender
                     and await self._ping(msg.target, msg.target_addr, timeout))
            cls = Ack if acked else Nack
            return encode(cls(msg.seq, self.node_id, self.piggyback(msg.sender, known=msg.updates)))
        return encode(Ack(0, self.node_id, self.piggyback(msg.sender, known=msg.updates)))

    # --- probing ---------------------------------------------------------------------------

    async def _ping(self, target: str, addr: str, timeout: float, news: bool = True) -> Ack | None:
        """One direct ping; the ack if ``target`` itself answered (its piggyback applied when
        ``news``), else None. A node acks only pings meant for it, so an ack proves that
        ``target`` is at ``addr``."""
        seq = next(self._seq)
        ping = Ping(seq, self.node_id, self.addr, self.local.incarnation, target,
                    self.piggyback(target) if news else ())
        reply = await self._request(addr, ping, timeout)
        if not isinstance(reply, Ack) or reply.seq != seq or reply.sender != target:
            return None
        if news:
            self.receive(reply.updates, self.intake(target))
        return reply

    async def _verify(self, c: Candidate) -> None:
        """Probe a proposed member at its claimed address (twice, in case one ping is lost)."""
        ack = None
        try:
            for _ in range(2):
                ack = await self._ping(c.node, c.addr, self.awareness.scale(self.config.probe_timeout), news=False)
                if ack is not None:
                    break
        finally:
            self.verifier.done(c, ack is not None, self._now())
            self.metrics.verifications.labels("ok" if ack is not None else "failed").inc()
            self.metrics.unverified.set(len(self.verifier))
        if ack is not None:
            self.verified(c)
            self.receive(ack.updates, self.intake(c.node))

    async def _ping_via(self, helper: Member, target: Member, timeout: float) -> str:
        """Ask ``helper`` to ping ``target``: "ack", "nack" or "no_answer"."""
        req = PingReq(next(self._seq), self.node_id, target.node_id, target.addr,
                      max(1, int(timeout * 1000)), self.piggyback(helper.node_id))
        reply = await self._request(helper.addr, req, timeout)
        result = "ack" if isinstance(reply, Ack) else "nack" if isinstance(reply, Nack) else "no_answer"
        if isinstance(reply, (Ack, Nack)):
            self.receive(reply.updates, self.intake(reply.sender))
        self.metrics.indirect_probes.labels(result).inc()
        return result

    async def _retry_direct(self, target: Member, timeout: float) -> str:
        return "ack" if await self._ping(target.node_id, target.addr, timeout) is not None else "failed"

    async def probe(self, target: Member, started: float) -> bool:
        """One protocol period against ``target`` (memberlist probeNode); True if it answered."""
        loop = asyncio.get_running_loop()
        deadline = started + self.awareness.scale(self.config.probe_interval)
        timeout = min(self.awareness.scale(self.config.probe_timeout), deadline - loop.time())
        if timeout > 0 and await self._ping(target.node_id, target.addr, timeout) is not None:
            self.metrics.probe_ok.inc()
            self.awareness.apply_delta(-1)
            self.metrics.health.set(self.awareness.score)
            return True
        helpers = [m for m in self.table.others(ALIVE) if m.node_id != target.node_id]
        helpers = self.rng.sample(helpers, min(self.config.indirect_checks, len(helpers)))
        remaining = deadline - loop.time()
        results: list[str] = []
        acked = False
        if remaining > 0.001:
            jobs = [self._ping_via(h, target, remaining) for h in helpers]
            if self.config.direct_retry:
                jobs.append(self._retry_direct(target, remaining))
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(j) for j in jobs]
                for next_done in asyncio.as_completed(tasks):
                    result = await next_done
                    results.append(result)
                    if result == "ack":
                        acked = True
                        for t in tasks:
                            t.cancel()
                        break
        if acked:
            self.metrics.probe_ok.inc()
            return True
        # Lifeguard: helpers that did not even nack suggest the problem is on our side
        nacks = results.count("nack")
        self.awareness.apply_delta(len(helpers) - nacks if helpers else 1)
        self.metrics.health.set(self.awareness.score)
        if not self.leaving:
            self._spawn(self._suspect(target.node_id))
        return False

    async def _suspect(self, node_id: str) -> None:
        """After a failed period: one last direct ping, then suspect, telling the suspect first.

        The last ping costs one message; it spares the cluster a suspicion (and the refutation
        that follows) each time a healthy member merely lost a few messages. A crashed member
        refuses it at once, so real failures are suspected without delay (a frozen or cut-off
        one, after ``probe_timeout``). Then the buddy rule: the accusation goes straight to
        the suspect, so it can refute before gossip reaches it, and into the gossip queue.
        """
        m = self.table.get(node_id)
        if m is None or m.state not in (ALIVE, SUSPECT):
            return
        if await self._ping(m.node_id, m.addr, self.awareness.scale(self.config.probe_timeout)) is not None:
            self.metrics.probes.labels("late_ack").inc()
            return
        m = self.table.get(node_id)
        if m is None or m.state not in (ALIVE, SUSPECT) or self.leaving:
            return
        self.metrics.probe_failed.inc()
        suspicion = Suspect(m.node_id, m.incarnation, self.node_id)
        self.apply(suspicion, origin="probe")
        await self._tell(m.addr, Gossip(self.node_id, (suspicion,)), self.config.probe_timeout)

    async def _tell(self, addr: str, msg: Gossip, timeout: float) -> None:
        reply = await self._request(addr, msg, timeout)
        if isinstance(reply, Ack):
            self.receive(reply.updates, self.intake(reply.sender))

    async def _probe_loop(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.rng.uniform(0, self.config.probe_interval))  # stagger the cluster
        while True:
            started = loop.time()
            if not self.leaving:
                target = self.next_probe_target()
                if target is not None:
                    await self.probe(target, started)
            next_tick = started + self.awareness.scale(self.config.probe_interval)
            await asyncio.sleep(max(0.0, next_tick - loop.time()))

    # --- gossip ----------------------------------------------------------------------------

    def _gossip_targets(self) -> list[Member]:
        now = self._now()
        pool = [m for m in self.table.others(ALIVE, SUSPECT, DEAD)
                if m.state != DEAD or now - m.changed_at < self.config.gossip_to_the_dead_time]
        return self.rng.sample(pool, min(self.config.gossip_nodes, len(pool)))

    def gossip_round(self) -> None:
        """Push queued updates to a few random members (fire-and-forget, bounded in flight)."""
        if not self.broadcasts or self._tg is None or self._gossip_in_flight >= 4 * self.config.gossip_nodes:
            return
        for m in self._gossip_targets():
            updates = self.piggyback(m.node_id)
            if not updates:
                break
            self._gossip_in_flight += 1
            self._spawn(self._gossip_to(m.addr, Gossip(self.node_id, updates)))

    async def _gossip_to(self, addr: str, msg: Gossip) -> None:
        try:
            await self._tell(addr, msg, self.config.probe_timeout)
        finally:
            self._gossip_in_flight -= 1

    async def _gossip_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.config.gossip_interval):
                    await self._gossip_now.wait()  # a refutation goes out at once
            except TimeoutError:
                pass
            self._gossip_now.clear()
            self.gossip_round()

    # --- push-pull -------------------------------------------------------------------------

    async def push_pull(self, addr: str, join: bool = False, timeout: float | None = None) -> bool:
        """Swap full state with the member at ``addr``; True if it answered."""
        timeout = self.config.push_pull_timeout if timeout is None else timeout
        reply = await self._request(addr, PushPull(self.node_id, join, self.records()), timeout)
        if not isinstance(reply, PushPull):
            self.metrics.push_pulls.labels("failed").inc()
            return False
        self.metrics.push_pulls.labels("ok").inc()
        before = self.local.incarnation
        # We chose this address, and the node there answered with its id: if it lists itself
        # there, that is as good as an ack. The members it names still have to be verified,
        # but a reply we asked for may propose as many as we have room for.
        me_there = next((r for r in reply.members if r.node == reply.sender and r.addr == addr), None)
        if me_there is not None and me_there.state == ALIVE and reply.sender != self.node_id:
            m = self.table.get(reply.sender)
            if m is None or m.addr != addr:
                self.verifier.discard(reply.sender)
                self.verified(Candidate(reply.sender, me_there.incarnation, addr, addr))
        self.merge(reply.members, reply.sender, self.intake(reply.sender, solicited=True))
        if self.local.incarnation != before and not join:
            # they held something against us: make sure our refutation reaches them at once
            alive = Alive(self.node_id, self.local.incarnation, self.addr)
            await self._tell(addr, Gossip(self.node_id, (alive,)), self.config.probe_timeout)
        return True

    async def _push_pull_loop(self) -> None:
        period = self.config.push_pull_period(self.table.live_count())
        await asyncio.sleep(self.rng.uniform(0, period))
        seed_turn = 0
        while True:
            if not self.leaving:
                alive = self.table.others(ALIVE)
                if alive:
                    await self.push_pull(self.rng.choice(alive).addr)
                dead = self.table.others(DEAD)
                if dead:  # a partition may have healed: try to reach the other side
                    await self.push_pull(self.rng.choice(dead).addr)
                if not alive and self._seeds:  # alone: try the seeds again
                    await self.push_pull(self._seeds[seed_turn % len(self._seeds)], join=True,
                                         timeout=self.config.join_timeout)
                    seed_turn += 1
            await asyncio.sleep(self.config.push_pull_period(self.table.live_count()))

    async def _reap_loop(self) -> None:
        every = min(60.0, max(1.0, min(self.config.dead_reap_time, self.config.left_reap_time) / 4))
        while True:
            await asyncio.sleep(every)
            self.reap()

    # --- life --------------------------------------------------------------------------------

    async def join(self, seeds: list[str]) -> None:
        """Push-pull with the seeds in turn, passes separated by a growing back-off, until one
        answers. Seeds are only a way in: any member will do, and none is needed later."""
        self._seeds = [s for s in dict.fromkeys(seeds) if s != self.addr]
        if not self._seeds:
            return
        delay = self.config.join_backoff
        for attempt in range(self.config.join_attempts):
            for seed in self._seeds:
                if await self.push_pull(seed, join=True, timeout=self.config.join_timeout):
                    log.info("joined through %s: %d members known", seed, len(self.table))
                    self._gossip_now.set()
                    return
                log.warning("seed %s did not answer", seed)
            if attempt + 1 < self.config.join_attempts:
                await asyncio.sleep(delay * self.rng.uniform(0.75, 1.25))
                delay = min(self.config.join_backoff_max, delay * 2)
        raise JoinError(f"no seed answered after {self.config.join_attempts} attempts: {', '.join(self._seeds)}")

    async def leave(self) -> None:
        """Gossip *left* to a few members directly (they spread it on) and stop probing."""
        if self.leaving:
            return
        left = self.mark_left()
        log.info("leaving the cluster (incarnation %d)", left.incarnation)
        pool = self.table.others(ALIVE, SUSPECT)
        targets = self.rng.sample(pool, min(len(pool), 2 * self.config.gossip_nodes))
        try:
            async with asyncio.timeout(self.config.leave_timeout):
                async with asyncio.TaskGroup() as tg:
                    for m in targets:
                        msg = Gossip(self.node_id, (left,) + self.piggyback(m.node_id))
                        tg.create_task(self._tell(m.addr, msg, self.config.leave_timeout))
        except TimeoutError:
            log.warning("leave: not every member answered within %.1f s", self.config.leave_timeout)

    async def run(self) -> None:
        self.restart_suspicions()
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self._probe_loop(), name="swim-probe")
                tg.create_task(self._gossip_loop(), name="swim-gossip")
                tg.create_task(self._push_pull_loop(), name="swim-push-pull")
                tg.create_task(self._reap_loop(), name="swim-reap")
                tg.create_task(self.verifier.run(self._verify, self._spawn), name="swim-verify")
        finally:
            self._tg = None
            self._gossip_in_flight = 0
            self.cancel_suspicions()
