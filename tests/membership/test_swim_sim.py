"""Whole clusters of real SwimMembership instances on the simulated network (virtual time).

The protocol code is the daemon's; only the transport and the clock are swapped
(benchlib/swim_sim.py), so a minute of cluster life costs well under a second.
"""

from __future__ import annotations

import asyncio

import pytest

from p2pnode.membership.base import EventKind, JoinError, MemberState
from benchlib.swim_sim import SimCluster, run_virtual
from p2pnode.membership.swim import SwimConfig

A, S, D, L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


def fail_events(cluster: SimCluster) -> list[tuple[str, str]]:
    """Collect (observer, member) for every FAIL event from now on."""
    seen: list[tuple[str, str]] = []
    for node in cluster.nodes.values():
        q = node.subscribe()
        orig_put = q.put_nowait

        def put(ev, observer=node.node_id, orig_put=orig_put):
            if ev.kind == EventKind.FAIL:
                seen.append((observer, ev.member.node_id))
            orig_put(ev)

        q.put_nowait = put  # type: ignore[method-assign]
    return seen


def test_join_through_any_member_is_seen_by_all_within_5s() -> None:
    async def main() -> None:
        c = SimCluster(seed=1)
        await c.spawn(20)
        assert await c.wait_for(c.converged, 10) is not None
        newcomer = c.add()
        c.start(newcomer)
        await newcomer.join([c.nodes["n0007"].addr])  # not the seed
        took = await c.wait_for(lambda: c.all_see(newcomer.node_id, A), 5)
        assert took is not None and took < 5
        assert await c.wait_for(lambda: len(newcomer.alive_peers()) == 20, 5) is not None
        await c.close()

    run_virtual(main)


def test_crash_is_detected_by_every_survivor_within_15s() -> None:
    async def main() -> None:
        c = SimCluster(seed=2)
        await c.spawn(20)
        await c.wait_for(c.converged, 10)
        fails = fail_events(c)
        c.crash("n0005")
        took = await c.wait_for(lambda: c.all_see("n0005", D), 15)
        assert took is not None, "not every survivor saw the crash within 15 s"
        await asyncio.sleep(10)
        assert {m for _, m in fails} == {"n0005"}  # nobody else was declared dead
        await c.close()

    run_virtual(main)


@pytest.mark.parametrize("seed", [3, 13, 23])
def test_node_frozen_for_3s_is_never_declared_dead(seed: int) -> None:
    async def main() -> None:
        c = SimCluster(seed=seed)
        await c.spawn(12)
        await c.wait_for(c.converged, 10)
        fails = fail_events(c)
        victim = c.nodes["n0004"]
        c.pause(victim.node_id)
        suspected = await c.wait_for(lambda: any(c.state_seen(o, victim.node_id) == S for o in c.running()), 3)
        await asyncio.sleep(3 - (suspected or 3))
        c.resume(victim.node_id)
        assert await c.wait_for(lambda: c.all_see(victim.node_id, A), 10) is not None
        await asyncio.sleep(30)
        assert fails == []  # suspected at most, never dead
        if suspected is not None:
            assert victim.incarnation >= 1  # it refuted
        assert c.converged()
        await c.close()

    run_virtual(main)


def test_suspected_node_refutes_when_it_hears_of_it() -> None:
    async def main() -> None:
        c = SimCluster(seed=33)
        await c.spawn(12)
        await c.wait_for(c.converged, 10)
        fails = fail_events(c)
        victim = c.nodes["n0006"]
        c.pause(victim.node_id)
        assert await c.wait_for(lambda: any(c.state_seen(o, victim.node_id) == S for o in c.running()), 15)
        c.resume(victim.node_id)
        assert await c.wait_for(lambda: c.all_see(victim.node_id, A), 10) is not None
        assert victim.incarnation >= 1
        assert sum(n.metrics.refutations._value.get() for n in c.nodes.values()) >= 1
        await asyncio.sleep(20)
        assert fails == [] and c.converged()
        await c.close()

    run_virtual(main)


def test_graceful_leave_is_seen_as_left_within_3s_not_as_failure() -> None:
    async def main() -> None:
        c = SimCluster(seed=4)
        await c.spawn(16)
        await c.wait_for(c.converged, 10)
        fails = fail_events(c)
        leaver = c.nodes["n0009"]
        await c.leave(leaver.node_id)
        took = await c.wait_for(lambda: c.all_see(leaver.node_id, L), 3)
        assert took is not None
        await asyncio.sleep(60)
        assert fails == [] and c.all_see(leaver.node_id, L)
        total_leaves = sum(n.metrics.leaves._value.get() for n in c.running())
        assert total_leaves == 15
        await c.close()

    run_virtual(main)


def test_partition_heals_within_one_push_pull_interval_plus_5s() -> None:
    async def main() -> None:
        cfg = SwimConfig.lan()
        c = SimCluster(seed=5)
        nodes = await c.spawn(16)
        await c.wait_for(c.converged, 10)
        left, right = nodes[:8], nodes[8:]
        c.net.partition([n.addr for n in left], [n.addr for n in right])
        await asyncio.sleep(30)
        # each side declared the other dead, and kept itself alive
        assert all(c.state_seen(o, n.node_id) == D for o in left for n in right)
        assert all(c.state_seen(o, n.node_id) == A for o in left for n in left)
        c.net.heal()
        took = await c.wait_for(c.converged, cfg.push_pull_interval + 5)
        assert took is not None, "the cluster did not heal in time"
        await c.close()

    run_virtual(main)


def test_cluster_survives_losing_every_seed() -> None:
    async def main() -> None:
        c = SimCluster(seed=6)
        await c.spawn(10, seeds=2)
        await c.wait_for(c.converged, 10)
        c.crash("n0000")
        c.crash("n0001")
        assert await c.wait_for(lambda: c.all_see("n0000", D) and c.all_see("n0001", D), 30) is not None
        newcomer = c.add()
        c.start(newcomer)
        # its seed list starts with the dead seeds: it falls through to a live member
        await newcomer.join([c.nodes["n0000"].addr, c.nodes["n0001"].addr, c.nodes["n0006"].addr])
        assert await c.wait_for(lambda: c.all_see(newcomer.node_id, A), 5) is not None
        assert len(newcomer.alive_peers()) == 8
        await c.close()

    run_virtual(main)


def test_restart_with_same_id_rejoins_with_a_higher_incarnation() -> None:
    async def main() -> None:
        c = SimCluster(seed=7)
        await c.spawn(8)
        await c.wait_for(c.converged, 10)
        old = c.nodes["n0003"]
        c.crash(old.node_id)
        assert await c.wait_for(lambda: c.all_see(old.node_id, D), 30) is not None
        reborn = c.add(node_id=old.node_id, incarnation=old.incarnation + 1)  # new address, too
        c.start(reborn)
        await reborn.join([c.nodes["n0000"].addr])
        # gossip reaches everyone with high probability in a second or two; in any case the
        # newcomer's own probes (which carry its alive record) reach every member within n periods
        assert await c.wait_for(c.converged, 10) is not None
        assert all(o.member(old.node_id).addr == reborn.addr for o in c.running())
        await c.close()

    run_virtual(main)


def test_join_backs_off_over_several_seeds_and_gives_up_cleanly() -> None:
    async def main() -> None:
        cfg = SwimConfig.lan(join_attempts=3, join_backoff=0.5, join_timeout=0.5)
        c = SimCluster(config=cfg, seed=8)
        (first,) = await c.spawn(1)
        loner = c.add()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(JoinError):
            await loner.join(["nowhere.sim:1", "nothing.sim:2"])
        # three passes, back-off 0.5 then 1.0 (with +-25 % jitter) between them
        assert 1.1 <= loop.time() - t0 <= 1.9
        joiner = c.add()
        c.start(joiner)
        await joiner.join(["nowhere.sim:1", first.addr])
        assert first.node_id in {m.node_id for m in joiner.alive_peers()}
        await c.close()

    run_virtual(main)


def test_no_false_deaths_under_10_percent_loss() -> None:
    async def main() -> None:
        c = SimCluster(seed=9)
        await c.spawn(32)
        await c.wait_for(c.converged, 10)
        fails = fail_events(c)
        c.net.loss = 0.10
        await asyncio.sleep(120)
        assert fails == []
        # and a real crash is still caught under the same loss
        c.crash("n0011")
        assert await c.wait_for(lambda: c.all_see("n0011", D), 40) is not None
        assert {m for _, m in fails} == {"n0011"}
        await c.close()

    run_virtual(main)
