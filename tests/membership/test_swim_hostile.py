"""A stranger against real SwimMembership instances on the simulated network (virtual time).

The attacker is a raw sender: it hands crafted, encoded SWIM messages to the victim's
transport through the simulated network, exactly as the daemon's HTTP endpoint would, so the
victim's decoding, bounds and rules are the daemon's. docs/MEMBERSHIP.md, "Hostile input".
"""

from __future__ import annotations

import asyncio

from p2pnode.membership.base import MAX_INCARNATION, EventKind, MemberState
from benchlib.swim_sim import SimCluster, SimNetwork, SimTransport, run_virtual
from p2pnode.membership.swim import SwimConfig, SwimMembership
from p2pnode.membership.swim.messages import (Alive, Dead, Gossip, Left, Message, MessageError, Ping, PushPull,
                                              Record, Suspect, decode, encode)
from p2pnode.membership.swim.transport import pack, unpack

A, S, D, L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
HUGE = 2**63 - 1
ATTACKER = "attacker.sim:6666"


async def send(c: SimCluster, victim: SwimMembership, msg: Message) -> Message:
    """One request from the attacker's address, through the simulated network."""
    kind = {Ping: "ping", Gossip: "gossip", PushPull: "push-pull"}[type(msg)]
    reply = await c.net.deliver(ATTACKER, victim.addr, kind, pack(encode(msg)), 5.0)
    return decode(unpack(reply, 1 << 24))


def value(node: SwimMembership, name: str, **labels: str) -> float:
    v = node.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if v is None else v


class ThirdParty(SimTransport):
    """Somebody else's server at an address the attacker names: counts what reaches it and
    answers nothing a SWIM node would (like an HTTP server that says 404)."""

    def __init__(self, net: SimNetwork, addr: str) -> None:
        super().__init__(net, addr)
        self.requests = 0

    async def handle_bytes(self, path_type: str, body: bytes, origin: str | None = None) -> bytes:
        self.requests += 1
        raise MessageError("404: not a membership endpoint")


async def cluster(n: int, seed: int) -> tuple[SimCluster, list[SwimMembership]]:
    c = SimCluster(seed=seed)
    nodes = await c.spawn(n)
    assert await c.wait_for(c.converged, 10) is not None
    return c, nodes


def test_ten_thousand_made_up_members_stay_unverified_bounded_and_are_dropped_in_seconds() -> None:
    async def main() -> None:
        c, (victim, peer) = await cluster(2, seed=21)
        cfg = victim.config
        joins = victim.subscribe()
        probes_before = value(victim, "p2pnode_membership_probes_total", result="ack")
        verified_before = value(victim, "p2pnode_membership_verifications_total", result="ok")
        ghosts = tuple(Record(f"ghost-{i:05d}", f"g{i:05d}.sim:7070", A, 0) for i in range(10_000))
        reply = await send(c, victim, PushPull("stranger", False, ghosts))
        # answered as usual, and nothing of the flood is in the table or the answer
        assert isinstance(reply, PushPull)
        assert {r.node for r in reply.members} == {victim.node_id, peer.node_id}
        assert 0 < len(victim.verifier) <= cfg.max_new_per_message
        assert value(victim, "p2pnode_membership_claims_refused_total", reason="message_limit") == (
            10_000 - cfg.max_new_per_message)
        # more of the same from one source: its quota; from a hundred made-up senders: the global bound
        peak = 0
        for i in range(100):
            batch = tuple(Record(f"more-{i}-{j}", f"m{i}-{j}.sim:7070", A, 0) for j in range(100))
            await send(c, victim, PushPull("stranger" if i < 10 else f"stranger-{i}", False, batch))
            peak = max(peak, len(victim.verifier))
            counts = {}
            for cand in victim.verifier.pending():
                counts[cand.source] = counts.get(cand.source, 0) + 1
            assert max(counts.values(), default=0) <= cfg.max_unverified_per_source
        assert peak <= cfg.max_unverified
        # never a member: no join event, not in alive_peers, not in the hints saved for a restart
        assert [p.node_id for p in victim.alive_peers()] == [peer.node_id]
        assert victim.hints() == [peer.addr]
        # every ghost got one probe (refused at once here) and was forgotten within seconds
        took = await c.wait_for(lambda: len(victim.verifier) == 0, 60)
        assert took is not None and took < cfg.max_unverified / cfg.verify_rate + 5
        assert value(victim, "p2pnode_membership_verifications_total", result="ok") == verified_before
        assert value(victim, "p2pnode_membership_verifications_total", result="failed") >= cfg.max_unverified
        assert len(victim.members()) == 2 and len(peer.members()) == 2
        assert all(ev.kind != EventKind.JOIN or ev.member.node_id == peer.node_id
                   for ev in [joins.get_nowait() for _ in range(joins.qsize())])
        # meanwhile the victim kept probing its real peer, and still does
        assert value(victim, "p2pnode_membership_probes_total", result="ack") > probes_before
        await asyncio.sleep(10)
        assert c.converged()
        await c.close()

    run_virtual(main)


def test_ghost_ids_at_a_third_partys_address_cost_it_a_few_probes_and_no_membership() -> None:
    async def main() -> None:
        c, (victim, peer, other) = await cluster(3, seed=22)
        cfg = victim.config
        third = ThirdParty(c.net, "third.sim:80")
        ghosts = tuple(Record(f"ghost-{i:04d}", third.addr, A, 0) for i in range(1000))
        # for 30 s the attacker repeats it every second, and also claims that a real member moved there
        for second in range(30):
            await send(c, victim, PushPull(f"stranger-{second}", False, ghosts))
            await send(c, victim, Gossip(peer.node_id, (Alive(peer.node_id, peer.incarnation + 1, third.addr),)))
            assert third.addr not in {p.addr for p in victim.alive_peers()}
            await asyncio.sleep(1)
        # one candidate per address, two pings each, then the address rests for verify_retry_after
        assert 0 < third.requests <= 2 * (30 / cfg.verify_retry_after + 1)
        assert victim.member(peer.node_id).addr == peer.addr
        assert {p.node_id for p in victim.alive_peers()} == {peer.node_id, other.node_id}
        # a real member's address under a made-up id: the member there answers as itself, so no
        assert victim.member("impostor") is None
        await send(c, victim, Gossip(peer.node_id, (Alive("impostor", 0, other.addr),)))
        await asyncio.sleep(2)
        assert victim.member("impostor") is None and len(victim.verifier) == 0
        await c.close()

    run_virtual(main)


def test_incarnation_claims_far_above_the_known_one_are_refused() -> None:
    async def main() -> None:
        c, (victim, peer, b) = await cluster(3, seed=23)
        recorded: list[int] = []
        victim._on_incarnation = recorded.append
        before = victim.member(b.node_id).incarnation
        own = victim.incarnation
        # even in a member's name (an impostor copying its id): about b, and about the victim itself
        for u in (Left(b.node_id, HUGE), Suspect(b.node_id, HUGE, peer.node_id), Dead(b.node_id, HUGE, peer.node_id),
                  Alive(b.node_id, HUGE, b.addr), Suspect(victim.node_id, HUGE, peer.node_id),
                  Dead(victim.node_id, HUGE, peer.node_id), Left(victim.node_id, 2**40)):
            await send(c, victim, Gossip(peer.node_id, (u,)))
        m = victim.member(b.node_id)
        assert (m.state, m.incarnation) == (A, before)
        assert victim.incarnation == own and recorded == []
        assert value(victim, "p2pnode_membership_claims_refused_total", reason="incarnation") == 7
        # within the bound, an accusation is refuted as always, one step past it
        await send(c, victim, Gossip(peer.node_id, (Suspect(victim.node_id, own + 5, peer.node_id),)))
        assert victim.incarnation == own + 6 and recorded == [own + 6]
        assert await c.wait_for(lambda: c.all_see(victim.node_id, A), 5) is not None
        assert all(n.incarnation <= MAX_INCARNATION for n in c.nodes.values())
        await c.close()

    run_virtual(main)


def test_dead_left_and_suspect_from_a_stranger_change_nothing() -> None:
    async def main() -> None:
        c, (victim, peer, b) = await cluster(3, seed=24)
        inc = victim.member(b.node_id).incarnation
        events = victim.subscribe()
        await send(c, victim, Gossip("stranger", (Dead(b.node_id, inc, "stranger"), Left(b.node_id, inc),
                                                  Suspect(b.node_id, inc, "stranger"))))
        await send(c, victim, PushPull("stranger", False, (Record(b.node_id, b.addr, D, inc + 1),
                                                           Record(peer.node_id, peer.addr, L, 9))))
        # a member relaying a suspicion by a non-member: no confirmation either
        await send(c, victim, Gossip(peer.node_id, (Suspect(b.node_id, inc, "made-up-accuser"),)))
        assert victim.member(b.node_id).state == A and victim.member(peer.node_id).state == A
        assert events.empty()
        # accusations of the victim itself from a stranger: nobody believes them, nothing to refute
        own = victim.incarnation
        await send(c, victim, Gossip("stranger", (Suspect(victim.node_id, own, "stranger"),
                                                  Alive(victim.node_id, own, "elsewhere.sim:1"))))
        await send(c, victim, Ping(1, victim.node_id, "elsewhere.sim:1", own, victim.node_id))  # in its own name
        assert victim.incarnation == own
        assert value(victim, "p2pnode_membership_claims_refused_total", reason="stranger") == 9
        await asyncio.sleep(5)
        assert c.converged()
        await c.close()

    run_virtual(main)


def test_a_members_own_refutation_wins_over_a_false_left() -> None:
    async def main() -> None:
        c, (victim, peer, b) = await cluster(3, seed=25)
        inc = b.incarnation
        # in a member's name (so accepted): b has left; nobody would tell b, as it has "left"
        await send(c, victim, Gossip(peer.node_id, (Left(b.node_id, inc),)))
        assert victim.member(b.node_id).state == L
        # b's next message to the victim is answered with the claim; b refutes; the victim sees it
        took = await c.wait_for(lambda: all(o.member(b.node_id).state == A for o in (victim, peer)), 10)
        assert took is not None and b.incarnation == inc + 1
        await c.close()

    run_virtual(main)


def test_the_seeds_reply_may_propose_more_than_a_strangers_share() -> None:
    """The bounds for strangers do not slow a join: the reply of the seed we chose proposes the
    whole cluster (bounded by max_unverified only), and the newcomer knows every member as soon
    as each answered its ping, long before probes or push-pulls could have introduced them."""

    async def main() -> None:
        cfg = SwimConfig.lan(max_new_per_message=2, max_unverified_per_source=3)
        c = SimCluster(config=cfg, seed=27)
        nodes = await c.spawn(12)
        assert await c.wait_for(c.converged, 30) is not None
        newcomer = c.add()
        c.start(newcomer)
        await newcomer.join([nodes[5].addr])
        assert len(newcomer.verifier) >= 10  # all but the seed, which the join itself verified
        took = await c.wait_for(lambda: len(newcomer.alive_peers()) == 12, 5)
        assert took is not None and took < 1
        await c.close()

    run_virtual(main)


def test_a_joining_node_still_joins_and_is_verified_by_everyone() -> None:
    async def main() -> None:
        c, nodes = await cluster(6, seed=26)
        newcomer = c.add()
        c.start(newcomer)
        await newcomer.join([nodes[3].addr])
        assert await c.wait_for(c.converged, 5) is not None
        # each member met it through its own probe of the newcomer's address
        for n in nodes:
            assert value(n, "p2pnode_membership_verifications_total", result="ok") >= 1
        assert value(newcomer, "p2pnode_membership_verifications_total", result="failed") == 0
        await c.close()

    run_virtual(main)
