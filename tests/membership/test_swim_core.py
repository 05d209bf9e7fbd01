"""Protocol rules of one SwimMembership instance, driven by hand (no network)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from p2pnode.membership.base import EventKind, MemberState
from benchlib.swim_sim import run_virtual
from p2pnode.membership.swim import SwimConfig, SwimMembership
from p2pnode.membership.swim.messages import (Ack, Alive, Dead, Gossip, Left, MessageError, Ping, PushPull,
                                              Record, Suspect, decode, encode)
from p2pnode.membership.swim.transport import Transport, TransportError

A, S, D, L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


class FakeTransport(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def send(self, addr: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.sent.append((addr, msg))
        raise TransportError("unreachable")


def make(node_id: str = "me", incarnation: int = 0, **kw: Any) -> SwimMembership:
    return SwimMembership(node_id, f"{node_id}.test:1", None, kw.pop("config", SwimConfig.lan()), incarnation,
                          transport=FakeTransport(), rng=random.Random(1), **kw)


def value(node: SwimMembership, name: str, **labels: str) -> float:
    v = node.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if v is None else v


def test_refutation_raises_incarnation_and_gossips_alive() -> None:
    async def main() -> None:
        seen: list[int] = []
        node = make(incarnation=3, on_incarnation=seen.append)
        node.apply(Suspect("me", 3, "x"))
        assert node.incarnation == 4 and seen == [4] and node.local.state == A
        assert node.broadcasts.queued("me") == Alive("me", 4, "me.test:1")
        assert value(node, "p2pnode_membership_refutations_total") == 1
        assert node.awareness.score == 1  # being suspected counts against our own health
        node.apply(Dead("me", 2, "x"))  # about an older life: ignored
        assert node.incarnation == 4
        node.apply(Dead("me", 9, "x"))  # raised past the accusation
        assert node.incarnation == 10
        node.apply(Left("me", 10))  # a tombstone of a previous life is refuted too
        assert node.incarnation == 11
        node.apply(Alive("me", 20, "me.test:1"))  # someone believes in a later life of ours
        assert node.incarnation == 21 and seen == [4, 10, 11, 21]

    run_virtual(main)


def test_leaving_node_refutes_nothing() -> None:
    async def main() -> None:
        node = make()
        node.mark_left()
        node.apply(Dead("me", 5, "x"))
        assert node.incarnation == 0 and node.local.state == L

    run_virtual(main)


def test_gossiped_suspicion_times_out_to_dead_and_confirmations_are_regossiped() -> None:
    async def main() -> None:
        node = make()
        events = node.subscribe()
        for i in range(4):
            node.apply(Alive(f"p{i}", 0, f"p{i}.test:1"))
        assert [(await events.get()).kind for _ in range(4)] == [EventKind.JOIN] * 4
        node.broadcasts.take(10**6)
        node.broadcasts._items.clear()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        node.apply(Suspect("p0", 0, "p1"))
        assert node.member("p0").state == S and node.broadcasts.queued("p0") == Suspect("p0", 0, "p1")
        node.broadcasts.drop("p0")
        node.apply(Suspect("p0", 0, "p1"))  # same sender again: not news
        assert "p0" not in node.broadcasts
        node.apply(Suspect("p0", 0, "p2"))  # independent confirmation: passed on
        assert node.broadcasts.queued("p0") == Suspect("p0", 0, "p2")
        node.apply(Suspect("p0", 0, "p3"))
        ev = await events.get()
        assert ev.kind == EventKind.FAIL and ev.member.node_id == "p0"
        # 5 members: floor 4 s, reached with k = 2 confirmations
        assert loop.time() - t0 == pytest.approx(4.0)
        assert node.member("p0").state == D and node.broadcasts.queued("p0") == Dead("p0", 0, "me")
        assert value(node, "p2pnode_membership_deaths_total") == 1

    run_virtual(main)


def test_refutation_cancels_the_suspicion() -> None:
    async def main() -> None:
        node = make()
        events = node.subscribe()
        node.apply(Alive("p", 0, "p.test:1"))
        await events.get()
        node.apply(Suspect("p", 0, "q"))
        assert "p" in node.suspicions
        node.apply(Alive("p", 1, "p.test:1"))
        assert "p" not in node.suspicions and node.member("p").state == A
        await asyncio.sleep(60)
        assert node.member("p").state == A and events.empty()  # no fail, no join: it never left

    run_virtual(main)


def test_push_pull_merge_rules() -> None:
    async def main() -> None:
        node = make(incarnation=2)
        for name in ("a", "b", "c", "d", "z"):
            node.apply(Alive(name, 1, f"{name}.test:1"))
        node.merge([
            Record("a", "a.test:1", D, 1),  # remote dead: only suspect here
            Record("b", "b.test:1", L, 1),  # remote left: left
            Record("c", "c.test:9", A, 5),  # newer life at a new address: verified there first
            Record("d", "d.test:1", A, 0),  # older news: ignored
            Record("e", "e.test:1", S, 0),  # unknown and not alive: ignored
            Record("f", "f.test:1", A, 0),  # unknown alive: a candidate, a member once verified
            Record("me", "me.test:1", D, 2),  # we are dead over there: refute
        ], sender="z")
        assert node.member("a").state == S and node.suspicions["a"]
        assert node.member("b").state == L
        assert (node.member("c").state, node.member("c").incarnation, node.member("c").addr) == (A, 1, "c.test:1")
        assert (node.member("d").state, node.member("d").incarnation) == (A, 1)
        assert node.member("e") is None and node.member("f") is None
        assert {(c.node, c.incarnation, c.addr) for c in node.verifier.pending()} == {
            ("c", 5, "c.test:9"), ("f", 0, "f.test:1")}
        assert node.incarnation == 3
        # the reply to a push-pull is built after the merge, so it carries the refutation
        reply = decode(await node.handle(encode(PushPull("z", False, (Record("me", "me.test:1", S, 3),)))))
        assert isinstance(reply, PushPull)
        mine = next(r for r in reply.members if r.node == "me")
        assert mine.incarnation == 4 and mine.state == A

    run_virtual(main)


def test_buddy_rule_tells_the_suspect_first() -> None:
    async def main() -> None:
        node = make()
        node.apply(Alive("p", 0, "p.test:1"))
        for i in range(60):
            node.apply(Alive(f"filler-{i}", 0, f"f{i}.test:1"))
        node.apply(Suspect("p", 0, "q"))
        batch = node.piggyback("p")
        assert batch[0] == Suspect("p", 0, "me")
        # and a ping from a member we hold as suspect gets the suspicion back in the ack
        ack = decode(await node.handle(encode(Ping(1, "p", "p.test:1", 0, "me"))))
        assert isinstance(ack, Ack) and ack.updates[0] == Suspect("p", 0, "me")

    run_virtual(main)


def test_ping_for_another_node_is_refused() -> None:
    async def main() -> None:
        node = make()
        with pytest.raises(MessageError, match="reached"):
            await node.handle(encode(Ping(1, "p", "p.test:1", 0, "somebody-else")))
        with pytest.raises(MessageError):
            await node.handle(encode(Ack(1, "p")))  # replies are not requests
        # a ping introduces its sender: a candidate until it answers our own ping there
        await node.handle(encode(Ping(2, "p", "p.test:1", 4, "me")))
        assert node.member("p") is None and "p" in node.verifier
        (c,) = node.verifier.pending()
        node.verified(c)
        assert node.member("p").state == A and node.member("p").incarnation == 4

    run_virtual(main)


def test_probe_order_is_a_shuffled_round_robin() -> None:
    async def main() -> None:
        node = make()
        names = [f"p{i:02d}" for i in range(20)]
        for n in names:
            node.apply(Alive(n, 0, f"{n}.test:1"))
        rounds = []
        for _ in range(3):
            rounds.append([node.next_probe_target().node_id for _ in names])
        for r in rounds:
            assert sorted(r) == names  # everyone exactly once per pass of n periods
        assert rounds[0] != rounds[1]  # reshuffled between passes
        node.apply(Dead("p05", 0, "x"))
        node.apply(Left("p06", 0))
        r = [node.next_probe_target().node_id for _ in range(18)]
        assert sorted(r) == sorted(set(names) - {"p05", "p06"})

    run_virtual(main)


def test_new_member_is_probed_within_the_current_pass() -> None:
    async def main() -> None:
        node = make()
        for i in range(10):
            node.apply(Alive(f"p{i}", 0, f"p{i}.test:1"))
        first = [node.next_probe_target().node_id for _ in range(5)]
        node.apply(Alive("new", 0, "new.test:1"))
        rest = [node.next_probe_target().node_id for _ in range(6)]
        assert "new" in rest and sorted(first + rest) == sorted([f"p{i}" for i in range(10)] + ["new"])

    run_virtual(main)


def test_events_for_leave_and_recover() -> None:
    async def main() -> None:
        node = make()
        events = node.subscribe()
        node.apply(Alive("p", 0, "p.test:1"))
        node.apply(Dead("p", 0, "x"))
        node.apply(Alive("p", 1, "p.test:2"))
        node.apply(Left("p", 1))
        node.apply(Left("p", 1))
        kinds = []
        while not events.empty():
            kinds.append(events.get_nowait().kind)
        assert kinds == [EventKind.JOIN, EventKind.FAIL, EventKind.RECOVER, EventKind.LEAVE]
        assert value(node, "p2pnode_membership_leaves_total") == 1
        assert node.metrics.member_counts.get(MemberState.LEFT) == 1

    run_virtual(main)


def test_status_lists_members_and_metrics_live_on_the_given_registry() -> None:
    async def main() -> None:
        reg = CollectorRegistry()
        node = SwimMembership("me", "me.test:1", None, None, 7, registry=reg, transport=FakeTransport())
        other = make("other")  # its own private registry: no clash
        node.apply(Alive("p", 2, "p.test:1"))
        st = node.status()
        assert st["incarnation"] == 7 and st["health_score"] == 0
        assert {(m["node_id"], m["addr"], m["state"], m["incarnation"]) for m in st["members"]} == {
            ("me", "me.test:1", "alive", 7), ("p", "p.test:1", "alive", 2)}
        assert reg.get_sample_value("p2pnode_membership_incarnation") == 7
        assert reg.get_sample_value("p2pnode_membership_joins_total") == 1
        assert other.metrics.registry is not reg
        names = {m.name for m in reg.collect()}
        for wanted in ("probes", "indirect_probes", "suspicions", "refutations", "deaths", "joins", "leaves",
                       "messages_sent", "messages_received", "sent_bytes", "received_bytes"):
            assert f"p2pnode_membership_{wanted}" in names

    run_virtual(main)


def test_gossip_reply_piggybacks_our_updates() -> None:
    async def main() -> None:
        node = make()
        node.apply(Alive("p", 0, "p.test:1"))
        node.apply(Alive("q", 2, "q.test:1"))
        reply = decode(await node.handle(encode(Gossip("p", (Alive("q", 3, "q.test:1"),)))))
        assert isinstance(reply, Ack)
        assert Alive("me", 0, "me.test:1") in reply.updates
        assert node.member("q").incarnation == 3

    run_virtual(main)


def test_config_profiles_and_validation() -> None:
    lan, wan = SwimConfig.lan(), SwimConfig.wan()
    assert (lan.probe_interval, lan.probe_timeout, lan.indirect_checks, lan.suspicion_mult,
            lan.suspicion_max_timeout_mult, lan.gossip_interval, lan.push_pull_interval) == (1.0, 0.5, 3, 4, 6, 0.2,
                                                                                            30.0)
    assert wan.probe_interval == 5.0 and wan.probe_timeout == 3.0 and wan.suspicion_mult == 6
    assert SwimConfig.profile("wan", gossip_nodes=5).gossip_nodes == 5
    with pytest.raises(ValueError, match="unknown SWIM setting"):
        SwimConfig.profile("lan", probe_intervall=1.0)
    with pytest.raises(ValueError, match="profile"):
        SwimConfig.profile("moon")
    with pytest.raises(ValueError, match="probe_timeout must be shorter"):
        SwimConfig(probe_timeout=2.0)
    with pytest.raises(ValueError, match="indirect_checks"):
        SwimConfig(indirect_checks=-1)


class ScriptedTransport(Transport):
    """Answers pings to ``target`` only after ``fail_first`` attempts; everything else fails."""

    def __init__(self, target: str, fail_first: int) -> None:
        super().__init__()
        self.target, self.fail_first = target, fail_first
        self.sent: list[tuple[str, str]] = []

    async def send(self, addr: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.sent.append((addr, msg["t"]))
        if msg["t"] == "ping" and msg["target"] == self.target:
            self.fail_first -= 1
            if self.fail_first < 0:
                return encode(Ack(msg["seq"], self.target))
        await asyncio.sleep(timeout)
        raise TransportError("timeout")


async def _probe_once(node: SwimMembership, target: str) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.TaskGroup() as tg:
        node._tg = tg
        await node.probe(node.table.get(target), loop.time())
    node._tg = None


def test_last_direct_ping_spares_a_suspicion() -> None:
    async def main() -> None:
        t = ScriptedTransport("x", fail_first=2)  # the first ping and the direct retry are lost
        node = SwimMembership("me", "me.test:1", None, None, transport=t, rng=random.Random(1))
        for name in ("x", "h1", "h2", "h3"):
            node.apply(Alive(name, 0, f"{name}.test:1"))
        await _probe_once(node, "x")
        assert node.member("x").state == A and "x" not in node.suspicions
        assert value(node, "p2pnode_membership_probes_total", result="late_ack") == 1
        assert [k for a, k in t.sent if a == "x.test:1"] == ["ping", "ping", "ping"]
        assert sorted(k for a, k in t.sent if a != "x.test:1") == ["ping-req"] * 3

    run_virtual(main)


def test_failed_period_suspects_and_tells_the_suspect_first() -> None:
    async def main() -> None:
        t = ScriptedTransport("x", fail_first=99)
        node = SwimMembership("me", "me.test:1", None, None, transport=t, rng=random.Random(1))
        for name in ("x", "h1", "h2", "h3"):
            node.apply(Alive(name, 0, f"{name}.test:1"))
        node.broadcasts._items.clear()
        await _probe_once(node, "x")
        assert node.member("x").state == S and "x" in node.suspicions
        assert value(node, "p2pnode_membership_probes_total", result="failed") == 1
        # direct ping, direct retry, last ping, then the accusation, all to x itself
        assert [k for a, k in t.sent if a == "x.test:1"] == ["ping", "ping", "ping", "gossip"]
        assert node.broadcasts.queued("x") == Suspect("x", 0, "me")  # and it is gossiped
        # no helper nacked: the failure counts against our own health too (Lifeguard)
        assert node.awareness.score == 3

    run_virtual(main)


def test_replies_leave_out_what_the_requester_sent() -> None:
    async def main() -> None:
        node = make()
        news = Alive("q", 3, "q.test:1")
        node.apply(Alive("p", 0, "p.test:1"))
        node.apply(Alive("q", 2, "q.test:1"))
        node.broadcasts._items.clear()
        reply = decode(await node.handle(encode(Gossip("p", (news,)))))
        assert news not in reply.updates  # p told us; echoing it back would waste a transmission
        assert node.broadcasts.transmits("q") == 0  # and it was not counted
        node.apply(Alive("r", 0, "r.test:1"))
        assert Alive("r", 0, "r.test:1") not in node.piggyback("r")  # r knows it is alive
        assert Alive("r", 0, "r.test:1") in node.piggyback("p")

    run_virtual(main)


def test_news_of_a_twin_is_counted_and_an_older_life_elsewhere_is_not() -> None:
    async def main() -> None:
        node = make(incarnation=3)
        node.apply(Alive("me", 2, "elsewhere.test:1"))  # our previous life, at its old address
        assert value(node, "p2pnode_membership_id_conflicts_total") == 0 and node.incarnation == 3
        node.apply(Alive("me", 3, "elsewhere.test:1"))  # this life, another address: another node, our id
        assert value(node, "p2pnode_membership_id_conflicts_total") == 1
        assert node.incarnation == 4  # and we say where we are, as before

    run_virtual(main)
