"""SWIM's state machine: what a node does with news, without any I/O.

``SwimCore`` holds the member table, the piggyback queue, the running suspicions and the
local health score, and applies member updates (alive / suspect / dead / left) under the
ordering rules of state.py, with the memberlist refinements:

* news that this node is suspect, dead or left (at its current incarnation or later) is
  refuted: the node raises its incarnation past the accusation and gossips ``alive``;
* a suspicion starts a Lifeguard timer (suspicion.py); further suspicions of the same member
  from other nodes confirm it and shrink the timer; when it runs out the member is ``dead``;
* every accepted update is queued to be piggybacked onward, and ``join`` / ``fail`` /
  ``leave`` / ``recover`` events go to subscribers.

News from the network enters through ``accept`` (``receive``, ``merge``), which applies the
rules for strangers of intake.py first: a node not verified at the claimed address is only a
candidate (verify.py); suspect / dead / left about another node count only from a member; an
incarnation far above the one we know is refused. ``apply`` is the trusted path, for what this
node concluded itself and what ``accept`` let through.

node.py adds the network: probes, gossip, push-pull, join and leave.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import time
from collections.abc import Callable, Collection, Iterable

from p2pnode.membership.base import EventKind, Member, Membership
from p2pnode.membership.swim.awareness import Awareness
from p2pnode.membership.swim.broadcast import BroadcastQueue, update_size
from p2pnode.config.swim import SwimConfig
from p2pnode.membership.swim.intake import APPLY, IGNORE, PROPOSE, Intake, about_self_refused, judge
from p2pnode.membership.swim.messages import Alive, Dead, Left, Record, Suspect, Update
from p2pnode.membership.swim.metrics import SwimMetrics
from p2pnode.membership.swim.state import ALIVE, DEAD, LEFT, SUSPECT, MemberTable
from p2pnode.membership.swim.suspicion import Suspicion
from p2pnode.membership.swim.verify import Candidate, Verifier

log = logging.getLogger("p2pnode.membership.swim")

#: seconds between two log lines about refused claims (the metric counts every one)
REFUSAL_LOG_EVERY = 10.0


class SwimCore(Membership):
    def __init__(self, node_id: str, addr: str, config: SwimConfig, incarnation: int, metrics: SwimMetrics,
                 rng: random.Random, on_incarnation: Callable[[int], None] | None) -> None:
        super().__init__()
        self.config = config
        self.node_id = node_id
        self.addr = addr
        self.metrics = metrics
        self.rng = rng
        self._on_incarnation = on_incarnation
        self.local = Member(node_id, addr, ALIVE, incarnation, self._now())
        self.table = MemberTable(self.local, config.max_members)
        self.broadcasts = BroadcastQueue(lambda: config.retransmit_limit(self.table.live_count()))
        self.awareness = Awareness(config.awareness_max_multiplier)
        self.suspicions: dict[str, Suspicion] = {}
        self.leaving = False
        #: shuffled round-robin probe order (memberlist: nodes list + probeIndex)
        self._probe_order: list[str] = []
        self._probe_index = 0
        self._gossip_now = asyncio.Event()
        self.verifier = Verifier(config)
        self._refusal_logged = self._conflict_logged = -REFUSAL_LOG_EVERY
        self.broadcasts.enqueue(Alive(node_id, incarnation, addr))
        metrics.incarnation.set(incarnation)
        self._members_changed()

    # --- reads (the Membership interface) -------------------------------------------------

    @property
    def incarnation(self) -> int:
        return self.local.incarnation

    def alive_peers(self) -> list[Member]:
        """Verified members only: candidates (verify.py) are not in the table at all."""
        return [copy.copy(m) for m in self.table.others(ALIVE)]

    def hints(self) -> list[str]:
        return [m.addr for m in self.table.others(ALIVE)][:self.config.max_remembered]

    def is_member(self, node_id: str) -> bool:
        """A verified member that is running as far as we know (alive or suspect)."""
        m = self.table.get(node_id)
        return m is not None and m is not self.local and m.state in (ALIVE, SUSPECT)

    def pusher(self, node_id: str) -> Member | None:
        """A verified member, alive or suspect (``is_member``): candidates are not in the table."""
        return self.member(node_id) if self.is_member(node_id) else None

    def members(self) -> list[Member]:
        return sorted((copy.copy(m) for m in self.table), key=lambda m: m.node_id)

    def member(self, node_id: str) -> Member | None:
        m = self.table.get(node_id)
        return copy.copy(m) if m is not None else None

    def status(self) -> dict[str, object]:
        now = self._now()
        members = []
        for m in sorted(self.table, key=lambda m: m.node_id):
            entry = m.to_json()
            entry["since_s"] = round(max(0.0, now - m.changed_at), 3)
            members.append(entry)
        return {"protocol": "swim", "node_id": self.node_id, "addr": self.addr,
                "incarnation": self.local.incarnation, "health_score": self.awareness.score,
                "leaving": self.leaving, "counts": {str(s): n for s, n in self.table.counts().items()},
                "queued_updates": len(self.broadcasts), "unverified": len(self.verifier), "members": members}

    # --- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _now() -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return time.monotonic()

    def _members_changed(self) -> None:
        self.metrics.set_members(self.table.counts())

    def _emit_copy(self, kind: EventKind, member: Member) -> None:
        self._emit(kind, copy.copy(member))

    def _schedule_probe(self, node_id: str) -> None:
        """A new (or returning) member gets a random slot in the rest of this probe round."""
        self._probe_order.insert(self.rng.randint(self._probe_index, len(self._probe_order)), node_id)

    def next_probe_target(self) -> Member | None:
        """Shuffled round-robin: every member is probed once per pass over the list."""
        for _ in range(2):
            while self._probe_index < len(self._probe_order):
                m = self.table.get(self._probe_order[self._probe_index])
                self._probe_index += 1
                if m is not None and m is not self.local and m.state in (ALIVE, SUSPECT):
                    return m
            self._probe_order = [m.node_id for m in self.table.others(ALIVE, SUSPECT)]
            self.rng.shuffle(self._probe_order)
            self._probe_index = 0
        return None

    def piggyback(self, dest: str | None, budget: int | None = None,
                  known: Collection[Update] = ()) -> tuple[Update, ...]:
        """Updates for one message to ``dest``: first what we hold against it (so a suspected
        or dead-declared member learns it at once and can refute: the buddy rule), then the
        least-sent queued updates, within the byte budget.

        Updates ``dest`` certainly has are left out without using up a transmission: those
        in ``known`` (the request we are answering carried them) and alive or left news
        about ``dest`` itself. Otherwise a reply would mostly echo the news that the sender
        is busy spreading, and each update would reach far fewer new members than its
        retransmit limit promises.
        """
        budget = self.config.max_piggyback_bytes if budget is None else budget
        out: list[Update] = []
        m = self.table.get(dest) if dest is not None else None
        if m is not None and m is not self.local and m.state in (SUSPECT, DEAD, LEFT):
            # a member we hold as left that still talks to us gets to refute it too
            u: Update = (Suspect(m.node_id, m.incarnation, self.node_id) if m.state == SUSPECT
                         else Dead(m.node_id, m.incarnation, self.node_id) if m.state == DEAD
                         else Left(m.node_id, m.incarnation))
            out.append(u)
            budget -= update_size(u) + 1
        known_set = set(known)

        def skip(u: Update) -> bool:
            return u in known_set or (u.node == dest and isinstance(u, (Alive, Left)))

        out.extend(self.broadcasts.take(budget, skip=skip))
        return tuple(out)

    def records(self) -> tuple[Record, ...]:
        return tuple(Record(m.node_id, m.addr, m.state, m.incarnation) for m in self.table)

    # --- applying news ---------------------------------------------------------------------

    def intake(self, sender: str, origin: str | None = None, solicited: bool = False) -> Intake:
        """The context for one received message from ``sender`` (``origin``: its host, if known;
        ``solicited``: the reply to a push-pull we sent to an address we chose)."""
        limit = self.config.max_unverified if solicited else self.config.max_new_per_message
        return Intake(sender, origin or sender, self.is_member(sender), limit, solicited)

    def receive(self, updates: Iterable[Update], src: Intake) -> None:
        for u in updates:
            self.accept(u, src)

    def accept(self, u: Update, src: Intake, origin: str = "gossip") -> None:
        """One update from the network, under the rules for strangers (intake.py)."""
        if u.node == self.node_id:
            if src.solicited or (src.sender != self.node_id and src.sender in self.table):
                self._about_self(u, src)
            else:  # nobody believes a stranger: nothing to refute, no incarnation to write
                self._refuse("stranger", u, src)
            return
        verdict = judge(u, src, self.table, self.config, self.is_member)
        if verdict == APPLY:
            self.apply(u, origin)
        elif verdict == PROPOSE:
            assert isinstance(u, Alive)
            why = self.verifier.offer(Candidate(u.node, u.incarnation, u.addr, src.source), self._now(),
                                      per_source=not src.solicited)
            if why is None:
                src.new_left -= 1
                self.metrics.unverified.set(len(self.verifier))
            elif why != "duplicate":
                self._refuse(why, u, src)
        elif verdict != IGNORE:
            self._refuse(verdict, u, src)

    def verified(self, c: Candidate) -> None:
        """``c`` answered our probe at its address with its id: it is a member now."""
        self._apply_alive(Alive(c.node, c.incarnation, c.addr))

    def _refuse(self, reason: str, u: Update, src: Intake | None) -> None:
        self.metrics.claims_refused.labels(reason).inc()
        sender = f"{src.sender} ({src.source})" if src is not None else "?"
        now = self._now()
        if now - self._refusal_logged >= REFUSAL_LOG_EVERY:
            self._refusal_logged = now
            log.warning("refusing membership news (%s): %s from %s; further refusals are only counted for %.0f s",
                        reason, u, sender, REFUSAL_LOG_EVERY)
        else:
            log.debug("refused (%s): %s from %s", reason, u, sender)

    def apply_all(self, updates: Iterable[Update], origin: str = "gossip") -> None:
        for u in updates:
            self.apply(u, origin)

    def apply(self, u: Update, origin: str = "gossip") -> None:
        """Apply an update as true: this node's own conclusions, or news ``accept`` let through."""
        if u.node == self.node_id:
            self._about_self(u)
        elif isinstance(u, Alive):
            self._apply_alive(u)
        elif isinstance(u, Suspect):
            self._apply_suspect(u, origin)
        elif isinstance(u, Dead):
            self._apply_dead(u)
        elif isinstance(u, Left):
            self._apply_left(u)

    def merge(self, records: Iterable[Record], sender: str, src: Intake | None = None) -> None:
        """Push-pull merge (memberlist mergeState): alive and left are taken as they are; a
        remote *dead* or *suspect* only makes us suspect, so one node's stale view cannot
        kill a member outright here, and a wrongly accused member gets to refute. Everything
        goes through ``accept``: from a stranger only alive claims count, as candidates."""
        src = src or self.intake(sender)
        for r in records:
            if r.state == ALIVE:
                self.accept(Alive(r.node, r.incarnation, r.addr), src)
            elif r.state == LEFT:
                self.accept(Left(r.node, r.incarnation), src)
            else:
                self.accept(Suspect(r.node, r.incarnation, sender), src)

    def _about_self(self, u: Update, src: Intake | None = None) -> None:
        me = self.local
        if self.leaving:
            return  # we are going; nothing to defend
        if about_self_refused(u, me.incarnation, self.config):
            self._refuse("incarnation", u, src)
            return
        if isinstance(u, Alive):
            twin = u.addr != me.addr and u.incarnation >= me.incarnation  # not an older life of ours
            if twin:
                self.metrics.id_conflicts.inc()
                if (now := self._now()) - self._conflict_logged >= REFUSAL_LOG_EVERY:
                    self._conflict_logged = now
                    log.error("another node says it is %s, at %s (we are at %s): node ids must be unique "
                              "(node.id)", u.node, u.addr, me.addr)
            if u.incarnation > me.incarnation or twin:
                self.refute(u.incarnation)
        elif u.incarnation >= me.incarnation:  # suspect, dead or left: we are not
            self.refute(u.incarnation)

    def refute(self, accused_incarnation: int) -> None:
        """Raise our incarnation past the accusation and tell everybody we are alive."""
        me = self.local
        me.incarnation = max(me.incarnation, accused_incarnation) + 1
        self.metrics.refutations.inc()
        self.metrics.incarnation.set(me.incarnation)
        self.awareness.apply_delta(1)  # being suspected hints that we are the slow one
        self.metrics.health.set(self.awareness.score)
        self.broadcasts.enqueue(Alive(self.node_id, me.incarnation, self.addr))
        self._gossip_now.set()
        log.info("refuting a suspicion: incarnation now %d", me.incarnation)
        if self._on_incarnation is not None:
            try:
                self._on_incarnation(me.incarnation)
            except Exception:  # a persistence hiccup must not stop the protocol
                log.exception("could not record incarnation %d", me.incarnation)

    def _apply_alive(self, u: Alive) -> None:
        t = self.table.apply(u.node, ALIVE, u.incarnation, u.addr, self._now())
        if t is None:
            return
        self._cancel_suspicion(u.node)
        self.broadcasts.enqueue(u)
        if t.before in (None, LEFT, DEAD):
            self.metrics.joins.inc()
            self._schedule_probe(u.node)
            self._emit_copy(EventKind.RECOVER if t.before == DEAD else EventKind.JOIN, t.member)
            log.info("member %s (%s) %s, incarnation %d", u.node, u.addr,
                     "joined" if t.before is None else f"is back ({t.before})", u.incarnation)
        if t.state_changed:
            self._members_changed()

    def _apply_suspect(self, u: Suspect, origin: str) -> None:
        m = self.table.get(u.node)
        if m is None or u.incarnation < m.incarnation:
            return
        running = self.suspicions.get(u.node)
        if running is not None and m.state == SUSPECT:
            if u.incarnation > m.incarnation:
                m.incarnation = u.incarnation
            if running.confirm(u.sender):  # an independent confirmation: pass it on
                self.broadcasts.enqueue(u)
            return
        t = self.table.apply(u.node, SUSPECT, u.incarnation, None, self._now())
        if t is None:
            return
        self.broadcasts.enqueue(u)
        if t.state_changed:
            self.metrics.suspicions.labels(origin).inc()
            self._members_changed()
            log.info("member %s suspected by %s (incarnation %d)", u.node, u.sender, u.incarnation)
        self._start_suspicion(u.node, u.sender)

    def _start_suspicion(self, node_id: str, sender: str) -> None:
        self._cancel_suspicion(node_id)
        n = self.table.live_count()
        low, high = self.config.suspicion_timeouts(n)
        k = self.config.suspicion_confirmations(n)

        def expired(confirmations: int) -> None:
            self.suspicions.pop(node_id, None)
            m = self.table.get(node_id)
            if m is not None and m.state == SUSPECT:
                log.info("member %s declared dead: suspicion timed out (%d confirmations)", node_id, confirmations)
                self._apply_dead(Dead(node_id, m.incarnation, self.node_id))

        self.suspicions[node_id] = Suspicion(sender, k, low, high, expired)

    def restart_suspicions(self) -> None:
        """Give every suspect member a timer (after ``run()`` restarts, which cancels them)."""
        for m in self.table.others(SUSPECT):
            if m.node_id not in self.suspicions:
                self._start_suspicion(m.node_id, self.node_id)

    def _cancel_suspicion(self, node_id: str) -> None:
        s = self.suspicions.pop(node_id, None)
        if s is not None:
            s.cancel()

    def cancel_suspicions(self) -> None:
        for node_id in list(self.suspicions):
            self._cancel_suspicion(node_id)

    def _apply_dead(self, u: Dead) -> None:
        t = self.table.apply(u.node, DEAD, u.incarnation, None, self._now())
        if t is None:
            return
        self._cancel_suspicion(u.node)
        self.broadcasts.enqueue(u)
        if t.state_changed:
            self.metrics.deaths.inc()
            self._members_changed()
            self._emit_copy(EventKind.FAIL, t.member)
            log.warning("member %s (%s) is dead (incarnation %d, by %s)", u.node, t.member.addr, u.incarnation,
                        u.sender)

    def _apply_left(self, u: Left) -> None:
        t = self.table.apply(u.node, LEFT, u.incarnation, None, self._now())
        if t is None:
            return
        self._cancel_suspicion(u.node)
        self.broadcasts.enqueue(u)
        if t.state_changed:
            self.metrics.leaves.inc()
            self._members_changed()
            self._emit_copy(EventKind.LEAVE, t.member)
            log.info("member %s (%s) left", u.node, t.member.addr)

    def mark_left(self) -> Left:
        """This node leaves: from now on it refutes nothing and probes nobody."""
        self.leaving = True
        self.local.state = LEFT
        self.local.changed_at = self._now()
        u = Left(self.node_id, self.local.incarnation)
        self.broadcasts.enqueue(u)
        self._members_changed()
        return u

    def reap(self) -> None:
        gone = self.table.reap(self._now(), self.config.dead_reap_time, self.config.left_reap_time)
        for m in gone:
            self._cancel_suspicion(m.node_id)
        if gone:
            self._members_changed()
            log.info("forgot %d long-gone member(s)", len(gone))
