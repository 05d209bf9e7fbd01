"""The synchronous mode's reducer (p2pnode/sync/reducer.py): one mean for every contributor,
a dead node costs one timeout and is then not waited for, the two phases stay linked, a node
with old Q factors is sent the current ones, and a contribution that cannot be averaged is
refused without changing the round."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from p2pnode.sync.outcome import Outcome, SyncRefused, parse
from p2pnode.sync.reducer import Reducer


def f16(*values: float) -> bytes:
    return np.asarray(values, dtype="<f2").tobytes()


def values(data: bytes) -> list[float]:
    return np.frombuffer(data, dtype="<f2").astype(float).tolist()


def reducer(running: set[str], wait: float = 0.2) -> Reducer:
    return Reducer(wait, lambda: set(running))


def f32(*v: float) -> bytes:
    return np.asarray(v, dtype="<f4").tobytes()  # the models go whole, float32


async def a_done_b_training(final_wait: float):
    """Reducer of a and b after one round together; a has sent its model (done training), b
    has not: (reducer, b's round, a's pending answer)."""
    r = Reducer(0.2, lambda: {"a", "b"}, final_wait=final_wait)
    first, _ = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))})
    return r, first[0].round, asyncio.ensure_future(r.contribute("a", 2, -2, f32(1, 1)))


async def both_phases(r: Reducer, nodes: dict[str, tuple[bytes, bytes]], q_round: int = -1):
    first = await asyncio.gather(*(r.contribute(n, 0, q_round, p) for n, (p, _) in nodes.items()))
    second = await asyncio.gather(*(r.contribute(n, 1, o.round, q) for (n, (_, q)), o in zip(nodes.items(), first)
                                    if o.included))
    return first, second


def test_every_contributor_gets_the_same_mean() -> None:
    async def go() -> None:
        r = reducer({"a", "b", "c"})
        first, second = await both_phases(r, {"a": (f16(1, 2), f16(3)), "b": (f16(3, 4), f16(5)),
                                              "c": (f16(5, 6), f16(7))})
        assert {o.data for o in first} == {f16(3, 4)} and all(o.included and o.count == 3 for o in first)
        assert {o.data for o in second} == {f16(5)} and {o.round for o in second} == {first[0].round}
        assert r.rounds == 1 and r.q_round == first[0].round
    asyncio.run(go())


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_the_mean_does_not_depend_on_which_node_sent_which_part(order: tuple[int, ...]) -> None:
    """Node ids are random, so the order the reducer sums in (sorted ids) differs from one run
    of a seed to the next. Summed in float32, 2048 + 0.001 - 2048 lost the 0.001 in one order
    and kept it in another (four runs of one seed on the daemons ended 90.33-90.62 %); the sum
    is taken in float64, and every labelling gives the same mean to the bit, in the float16
    phases and in the models' float32 mean after training."""
    parts16 = [(2048.0, 1.0), (0.001, 3.0), (-2048.0, 5.0)]
    parts32 = [(1e8, 1.0), (1.0, 3.0), (-1e8, 5.0)]

    async def go() -> tuple[bytes, bytes]:
        names = ["a", "b", "c"]
        r = reducer(set(names))
        first, _ = await both_phases(r, {names[i]: (f16(*parts16[j]), f16(1)) for i, j in enumerate(order)})
        final = reducer(set(names))
        outs = await asyncio.gather(*(final.contribute(names[i], 2, -2, f32(*parts32[j])) for i, j in enumerate(order)))
        assert {o.count for o in outs} == {3} and len({o.data for o in outs}) == 1
        return first[0].data, outs[0].data

    mean16, mean32 = asyncio.run(go())
    assert mean16 == f16(np.float64(np.float16(0.001)) / 3, 3.0)
    assert mean32 == f32(1 / 3, 3.0)


def test_a_dead_node_costs_one_timeout_then_is_not_waited_for() -> None:
    async def go() -> None:
        r = reducer({"a", "b", "c"}, wait=0.3)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        first, _ = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))})
        assert loop.time() - t0 >= 0.29  # c was expected: the phase waited for it
        assert all(o.count == 2 and o.included for o in first) and values(first[0].data) == [2.0]
        t1 = loop.time()
        first, _ = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))}, first[0].round)
        assert loop.time() - t1 < 0.25  # the next round expects only a and b
        # c comes back: too late for a round that closes once a and b are in, but waited for
        # from the next round on, and in
        rnd = first[0].round
        trio = {"a": (f16(1), f16(1)), "b": (f16(3), f16(1)), "c": (f16(5), f16(1))}
        first, _ = await both_phases(r, trio, rnd)
        assert [o.included for o in first] == [True, True, False] and first[0].count == 2
        first, _ = await both_phases(r, trio, first[0].round)
        assert all(o.count == 3 and o.included for o in first) and values(first[0].data) == [3.0]
    asyncio.run(go())


def test_old_q_factors_get_the_current_ones_and_phase_one_only_from_phase_zero() -> None:
    async def go() -> None:
        r = reducer({"a", "b"})
        first, second = await both_phases(r, {"a": (f16(1), f16(8)), "b": (f16(3), f16(10))})
        rnd = first[0].round
        # c still holds the seeded Q factors (round -1): not averaged, sent round rnd's Q mean
        late = await r.contribute("c", 0, -1, f16(100))
        assert not late.included and late.round == rnd and values(late.data) == [9.0]
        # a phase 1 for a round c was not in: refused, nothing averaged
        out = await r.contribute("c", 1, rnd, f16(100))
        assert not out.included and values(out.data) == [9.0]  # the closed phase's mean
    asyncio.run(go())


def test_a_contribution_after_its_round_closed_waits_for_the_next() -> None:
    async def go() -> None:
        r = reducer({"a", "b"})
        first = await asyncio.gather(r.contribute("a", 0, -1, f16(1)), r.contribute("b", 0, -1, f16(3)))
        # phase 1 of that round is open: a third node's phase 0 with the same Q is too late
        late = await r.contribute("c", 0, -1, f16(5))
        assert not late.included and late.data == b""
        await asyncio.gather(r.contribute("a", 1, first[0].round, f16(1)), r.contribute("b", 1, first[0].round, f16(1)))
    asyncio.run(go())


@pytest.mark.parametrize("bad", [b"", b"\x00", f16(float("nan")), f16(float("inf"), 1)])
def test_bad_contributions_are_refused(bad: bytes) -> None:
    with pytest.raises(SyncRefused):
        parse(bad)


def test_a_refused_contribution_changes_nothing() -> None:
    async def go() -> None:
        r = reducer({"a", "b"})
        a = asyncio.create_task(r.contribute("a", 0, -1, f16(1, 1)))
        await asyncio.sleep(0)
        with pytest.raises(SyncRefused):
            await r.contribute("b", 0, -1, f16(1, 2, 3))  # another length than the round's
        with pytest.raises(SyncRefused):
            await r.contribute("b", 3, -1, f16(1, 2))
        b = await r.contribute("b", 0, -1, f16(3, 3))
        assert values(b.data) == [2.0, 2.0] and b.count == 2 and (await a).count == 2
    asyncio.run(go())


def test_the_models_mean_after_training_reaches_latecomers_too() -> None:
    async def go() -> None:
        r = reducer({"a", "b", "c"}, wait=0.2)
        first = await asyncio.gather(r.contribute("a", 2, -2, f32(1, 3.1)), r.contribute("b", 2, -2, f32(3, 5)))
        assert all(o.count == 2 and o.included for o in first) and first[0].data == f32(2, 4.05)
        late = await r.contribute("c", 2, -2, f32(9, 9))  # after it closed: given the mean, not in it
        assert not late.included and late.data == f32(2, 4.05)
    asyncio.run(go())


def test_a_restarted_reducer_follows_the_newest_q_factors() -> None:
    async def go() -> None:
        r = reducer({"r", "a", "b"}, wait=0.3)
        fresh = asyncio.create_task(r.contribute("r", 0, -1, f16(1)))  # its own worker, restarted: seeded Q
        await asyncio.sleep(0)
        first = await asyncio.gather(r.contribute("a", 0, 5, f16(2)), r.contribute("b", 0, 5, f16(4)))
        assert all(o.included and o.count == 2 and o.round == 6 for o in first) and values(first[0].data) == [3.0]
        dropped = await fresh
        assert not dropped.included and dropped.data == b""
        await asyncio.gather(r.contribute("a", 1, 6, f16(1)), r.contribute("b", 1, 6, f16(3)))
        behind = await r.contribute("r", 0, -1, f16(1))  # still the seeded Q: told so, with the current ones
        assert behind.behind and not behind.included and behind.round == 6 and values(behind.data) == [2.0]
    asyncio.run(go())


def test_a_fresh_reducer_does_not_wait_for_its_own_node_once_it_is_told_it_is_behind() -> None:
    """The others came back to a restarted reducer with Q factors of round 5; its own worker
    holds the seeded ones. Told it is behind, it cannot make this round (it needs the round's
    Q first), so the round closes with the others at once, not after ``wait`` (during which the
    worker took a local step each try and ran its step count ahead of the group's)."""
    async def go() -> None:
        r = reducer({"r", "a", "b"}, wait=5.0)
        others = [asyncio.create_task(r.contribute(n, 0, 5, f16(v))) for n, v in (("a", 2), ("b", 4))]
        await asyncio.sleep(0)
        behind = await r.contribute("r", 0, -1, f16(1))
        assert behind.behind and not behind.included
        first = await asyncio.wait_for(asyncio.gather(*others), 1.0)  # not the 5 s
        assert all(o.included and o.count == 2 and o.round == 6 for o in first) and values(first[0].data) == [3.0]
        await asyncio.gather(r.contribute("a", 1, 6, f16(1)), r.contribute("b", 1, 6, f16(3)))
        again = await r.contribute("r", 0, -1, f16(1))  # the round's Q now comes with the answer
        assert again.behind and again.round == 6 and values(again.data) == [2.0]
        nxt = [asyncio.create_task(r.contribute(n, 0, 6, f16(1))) for n in ("a", "b")]
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in nxt)  # from the next round on it is waited for again
        mine = await r.contribute("r", 0, 6, f16(4))
        assert mine.included and mine.count == 3
        await asyncio.gather(*nxt)
    asyncio.run(go())


def test_a_reducer_that_only_ever_reduced_for_its_own_node_follows_the_groups_rounds() -> None:
    """The lowest id came back after membership had called it dead: its worker was ready
    before the others had heard of it, and it closed rounds for its own node alone. When the
    others come to it with the Q factors of their own rounds, theirs are the group's: it drops
    its own and follows on from theirs (before, it told them they were behind, and they took
    its lone model whole)."""
    async def go() -> None:
        r = reducer({"r", "a", "b"}, wait=0.1)
        q = -1
        for _ in range(3):
            first, _ = await both_phases(r, {"r": (f16(1), f16(1))}, q)
            q = first[0].round
        assert r.rounds == 3 and r.q_round == q == 2
        theirs = await asyncio.gather(r.contribute("a", 0, 50, f16(2)), r.contribute("b", 0, 50, f16(4)))
        assert all(o.included and o.round == 51 and o.count == 2 for o in theirs), theirs
        mine = await r.contribute("r", 0, q, f16(1))  # ours is behind now: it catches up
        assert mine.behind and not mine.included
    asyncio.run(go())


def test_a_reducer_with_rounds_of_its_own_ignores_a_claim_of_newer_q() -> None:
    async def go() -> None:
        r = reducer({"a", "b"})
        first, _ = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))})
        rnd = first[0].round
        claim = await r.contribute("m", 0, 10**9, f16(7))  # a member claiming Q factors from far ahead
        assert not claim.included and claim.behind and r.q_round == rnd
        again, _ = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))}, rnd)
        assert all(o.included for o in again)  # the others go on as before
    asyncio.run(go())


def test_a_node_a_step_behind_at_the_end_is_waited_for_and_not_waited_on() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        # a is done; b still has three steps to take: its rounds do not wait for a, and the
        # models' mean waits for b while b makes progress, beyond the 0.2 s of a phase
        r, rnd, done = await a_done_b_training(final_wait=5.0)
        for _ in range(3):
            await asyncio.sleep(0.15)
            one = await r.contribute("b", 0, rnd, f16(3))
            assert one.included and one.count == 1
            two = await r.contribute("b", 1, one.round, f16(1))
            assert two.included and two.count == 1
            rnd = two.round
        assert loop.time() - t0 < 0.9  # no phase waited 0.2 s for a
        last = await r.contribute("b", 2, -2, f32(3, 5))
        ours = await done
        assert last.count == ours.count == 2 and ours.included and ours.data == f32(2, 3)
    asyncio.run(go())


def test_the_models_mean_waits_at_most_final_wait() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        r, rnd, done = await a_done_b_training(final_wait=0.5)
        while not done.done():  # b trains on and on
            one = await r.contribute("b", 0, rnd, f16(3))
            rnd = (await r.contribute("b", 1, one.round, f16(1))).round
            await asyncio.sleep(0.05)
        assert 0.45 <= loop.time() - t0 < 1.0 and done.result().count == 1
    asyncio.run(go())


async def rounds_with_c_slow(r: Reducer, rounds: int = 12, classes: dict[str, list[int]] | None = None,
                             ) -> list[tuple[int, list, list, Outcome, bool]]:
    """``rounds`` rounds of a and b (steps of 0.05 s) with c's contributions 0.1 s behind theirs
    every round (steps of 0.15 s), each phase 0 saying its node's label histogram in ``classes``
    (none: not said). Per round: (the round before it, a and b's phase-1 outcomes, c's phase-1
    outcome (None: not in phase 0), c's phase-0 outcome, whether a and b waited for c)."""
    rnd, out = -1, []
    said = classes or {}

    async def c_late(q: int) -> tuple[Outcome, Outcome | None]:
        await asyncio.sleep(0.1)
        first = await r.contribute("c", 0, q, f16(5), took=0.15, classes=said.get("c"))
        return first, (await r.contribute("c", 1, first.round, f16(1)) if first.included else None)

    for _ in range(rounds):
        late = asyncio.ensure_future(c_late(rnd))
        first = await asyncio.gather(r.contribute("a", 0, rnd, f16(1), took=0.05, classes=said.get("a")),
                                     r.contribute("b", 0, rnd, f16(3), took=0.05, classes=said.get("b")))
        second = await asyncio.gather(*(r.contribute(n, 1, first[0].round, f16(1)) for n in "ab"))
        # waited: c (0.1 s behind) is in the round's phase 0. Not timed: on a loaded machine a
        # and b's own round took 0.09 s now and then, and read as a wait
        waited = first[0].count == 3
        c_first, c_second = await late
        out.append((rnd, [*first, *second], [c_second], c_first, waited))
        rnd = second[0].round
        await asyncio.sleep(0.02)  # a and b's next step
    return out


def test_a_node_much_slower_than_the_rest_is_not_waited_for_and_replays_what_it_missed() -> None:
    async def go() -> None:
        r = reducer({"a", "b", "c"}, wait=2.0)
        seen = await rounds_with_c_slow(r)
        replays = 0
        for before, ab, _, c_out, _ in seen:
            if c_out.replay:  # c steps along every round it missed, in order, ending on the current one
                replays += 1
                assert [x[0] for x in c_out.replay] == list(range(before + 1, ab[-1].round + 1))
                assert all(x[1] == r.closed[(x[0], 0)][0] and x[2] == r.closed[(x[0], 1)][0] for x in c_out.replay)
        # waited for in its first steps, then not (a and b close their rounds at once), c replaying them
        waited = [w for *_, w in seen]
        assert waited[0] and not any(waited[-6:]), waited
        assert r.late.slow() == {"c"} and r.rounds == 12 and replays >= 6
    asyncio.run(go())


def test_slow_is_against_the_others_median_and_says_nothing_on_jitter() -> None:
    from p2pnode.sync.lateness import WARMUP, Lateness

    late = Lateness()
    for _ in range(WARMUP + 20):
        for node, took in {"a": 0.080, "b": 0.085, "c": 0.095, "d": 0.16}.items():
            late.came(node, took)
    assert late.slow() == {"d"}  # twice the others' median; c, a fifth over it, is waited for
    assert late.slow({"a", "d"}) == {"d"} and late.slow({"a", "b", "c"}) == set()
    quick = Lateness()  # tiny steps: 2 ms against 1 ms is not worth dropping a gradient for
    for _ in range(WARMUP + 20):
        quick.came("a", 0.001)
        quick.came("b", 0.002)
    assert quick.slow() == set()


def test_no_replay_for_the_seeded_q_or_rounds_no_longer_kept() -> None:
    async def go() -> None:
        r = reducer({"a"}, wait=0.1)
        rnd = -1
        for _ in range(3):
            first = await r.contribute("a", 0, rnd, f16(1))
            rnd = (await r.contribute("a", 1, first.round, f16(1))).round
        fresh = await r.contribute("b", 0, -1, f16(1))  # a new or restarted node: takes a model instead
        assert fresh.behind and not fresh.replay
        back = await r.contribute("b", 0, 0, f16(1))  # took part in round 0: replays 1 and 2
        assert [x[0] for x in back.replay] == [1, 2] and not back.behind
        r.closed.pop((1, 1))
        gone = await r.contribute("c", 0, 0, f16(1))
        assert gone.behind and not gone.replay
    asyncio.run(go())


def test_a_slow_node_in_phase_zero_is_not_waited_for_in_phase_one() -> None:
    """A straggler's late gradient, offered again, made the next round's phase 0 (its P counts):
    the round's phase 1 still closes on the others, and the straggler coming after is answered
    with that mean, not in it (it keeps its gradient as error feedback)."""
    from p2pnode.sync.lateness import WARMUP

    async def go() -> None:
        r = reducer({"a", "b", "s"}, wait=2.0)
        for _ in range(WARMUP + 5):
            for node, took in {"a": 0.05, "b": 0.05, "s": 0.12}.items():
                r.late.came(node, took)
        assert r.late.slow() == {"s"}
        first = await asyncio.gather(*(r.contribute(n, 0, -1, f16(v)) for n, v in (("s", 5), ("a", 1), ("b", 3))))
        assert all(o.included and o.count == 3 for o in first) and values(first[0].data) == [3.0]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        second = await asyncio.gather(*(r.contribute(n, 1, first[0].round, f16(v)) for n, v in (("a", 1), ("b", 3))))
        assert loop.time() - t0 < 1.0 and all(o.included and o.count == 2 for o in second)  # not the 2 s wait
        late = await r.contribute("s", 1, first[0].round, f16(9))
        assert late.data == second[0].data and not late.included
    asyncio.run(go())


def test_a_reducer_whose_own_node_is_slow_stands_down_for_a_while_then_comes_back_fresh(monkeypatch) -> None:
    """Its node slow at SUSTAIN round starts in a row (every node timed), the reducer answers the
    next round's contributions, and any other phase, with ``step_down``: the round from which it
    reduces again. At that round it follows the others' Q factors as a fresh reducer."""
    from p2pnode.sync import standdown as mod
    from p2pnode.sync.lateness import WARMUP

    monkeypatch.setattr(mod, "REST_ROUNDS", 5)

    async def go() -> None:
        r = Reducer(2.0, lambda: {"r", "a", "b"}, me="r")
        rnd = -1
        for i in range(WARMUP + mod.SUSTAIN - 1):  # timed from its WARMUP + 1st step, then SUSTAIN - 1 more
            if i == WARMUP - 1:
                assert r.late.slow() == set()  # not before every node is timed
            for n, took in (("r", 0.2), ("a", 0.05), ("b", 0.05)):
                r.late.came(n, took)
            first, second = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))}, rnd)
            assert all(o.included and not o.step_down for o in first + second), i
            rnd = second[0].round
        down = await r.contribute("a", 0, rnd, f16(1))
        assert not down.included and down.step_down == rnd + 1 + 5 and r.resting_until == down.step_down
        # resting, it still hands a node behind (its own slow one) the rounds it closed, to replay
        kept = r.replay_for(rnd - 2)
        assert [x[0] for x in kept.replay] == [rnd - 1, rnd] and not kept.included and not r.replay_for(rnd).replay
        again = await asyncio.gather(r.contribute("b", 1, rnd, f16(1)), r.contribute("b", 2, -2, f32(1)))
        assert all(o.step_down == down.step_down and not o.included for o in again)
        back = await asyncio.gather(*(r.contribute(n, 0, down.step_down - 1, f16(v)) for n, v in (("a", 1), ("b", 3))))
        assert all(o.included and o.round == down.step_down and not o.step_down for o in back)
        assert r.resting_until == 0 and r.late.step == {}  # measured afresh
        assert not r.replay_for(rnd - 2).replay  # and its old rounds are gone
    asyncio.run(go())


def test_a_reducer_idle_for_a_while_follows_a_claim_of_newer_q(monkeypatch) -> None:
    """It stood in for a reducer that stood down, which has since taken over again: when the
    rounds come back to it, they are far past its last."""
    from p2pnode.sync import reducer as mod

    monkeypatch.setattr(mod, "IDLE_RESET", 0.1)

    async def go() -> None:
        r = reducer({"a", "b"})
        first, _ = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))})
        await asyncio.sleep(0.15)
        later, _ = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))}, first[0].round + 40)
        assert all(o.included and o.round == first[0].round + 41 for o in later)
    asyncio.run(go())


def test_a_stand_in_does_not_wait_for_the_reducer_that_stood_down_until_it_has_timed_it() -> None:
    """The reducer o stood down for being slow; b, next lowest, is fresh and has timed nobody:
    its rounds close on the nodes that came (not a sync_timeout waiting for o), and o is waited
    for again once b has timed it and found it as fast as the rest."""
    from p2pnode.sync.lateness import WARMUP

    async def go() -> None:
        r = Reducer(2.0, lambda: {"o", "a", "b"}, stood_down=lambda: {"o"})
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        first, second = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))}, 7)
        assert loop.time() - t0 < 1.0 and all(o.included and o.count == 2 and o.round == 8 for o in first)
        rnd = second[0].round
        for _ in range(WARMUP + 1):  # o comes in time, as fast as a and b
            took = {"o": 0.05, "a": 0.05, "b": 0.05}
            first = await asyncio.gather(*(r.contribute(n, 0, rnd, f16(1), took=took[n]) for n in took))
            second = await asyncio.gather(*(r.contribute(n, 1, first[0].round, f16(1)) for n in took))
            rnd = second[0].round
        assert "o" in r.late.step and not r._not_waited({"o", "a", "b"})
        b_alone = asyncio.ensure_future(r.contribute("b", 0, rnd, f16(1)))
        await asyncio.sleep(0.3)
        assert not b_alone.done()  # o is waited for again
        await asyncio.gather(r.contribute("a", 0, rnd, f16(1)), r.contribute("o", 0, rnd, f16(1)))
        assert (await b_alone).count == 3
    asyncio.run(go())


def test_asking_only_for_the_rounds_missed_never_joins_a_round() -> None:
    async def go() -> None:
        r = reducer({"a", "b"})
        rnd = -1
        for _ in range(3):
            _, second = await both_phases(r, {"a": (f16(1), f16(1)), "b": (f16(3), f16(1))}, rnd)
            rnd = second[0].round
        assert [x[0] for x in r.replay_for(rnd - 2).replay] == [rnd - 1, rnd]
        assert not r.replay_for(rnd).replay and r.open0 is None  # in step: nothing, and no round opened
    asyncio.run(go())


def test_a_reducer_does_not_stand_down_once_the_models_mean_has_begun(monkeypatch) -> None:
    """A node done training sent its model here: standing down now would split the mean."""
    from p2pnode.sync import standdown as mod
    from p2pnode.sync.lateness import WARMUP

    monkeypatch.setattr(mod, "SUSTAIN", 1)

    async def go() -> None:
        r = Reducer(0.5, lambda: {"r", "a", "b"}, final_wait=0.5, me="r")
        for _ in range(WARMUP + 2):
            for n, took in (("r", 0.2), ("a", 0.05), ("b", 0.05)):
                r.late.came(n, took)
        done = asyncio.ensure_future(r.contribute("b", 2, -2, f32(1, 1)))
        await asyncio.sleep(0)
        first = await r.contribute("a", 0, -1, f16(1))
        assert not first.step_down and first.included and r.resting_until == 0
        done.cancel()
    asyncio.run(go())


def test_with_wait_for_slow_a_much_slower_node_is_waited_for_every_round() -> None:
    """``exchange.sync_wait_for_slow = "always"``: as DDP, every round waits for the slow node (its data
    counts in each at its whole weight), and a reducer whose own node is slow never stands down."""
    async def go() -> None:
        r = Reducer(2.0, lambda: {"a", "b", "c"}, me="c", wait_for_slow="always")  # the reducer's own node is the slow one
        for _, ab, (c_second,), c_first, waited in await rounds_with_c_slow(r):
            assert waited and c_first.included and not c_first.replay and c_second is not None and c_second.included
            assert all(o.count == 3 and not o.step_down for o in ab) and ab[0].data == f16(3)
        assert r.rounds == 12 and r.resting_until == 0
        assert r.late.slow() == {"c"}  # timed as slow all the same, and waited for
    asyncio.run(go())


#: label histograms: a and b hold the same mix of classes; c's is its own (total variation 0.8)
LIKE = {"a": [50, 50, 50, 50, 0], "b": [50, 50, 50, 50, 0], "c": [50, 50, 50, 50, 0]}
UNLIKE = {**LIKE, "c": [0, 0, 0, 50, 200]}


@pytest.mark.parametrize("me", ["a", "c"])
def test_auto_waits_for_a_slow_node_whose_classes_are_its_own(me: str) -> None:
    """``exchange.sync_wait_for_slow = "auto"``: c's data is unlike a and b's, so dropping its
    gradients would drop its classes: every round waits for it, as DDP would; and when c is
    the reducer's own node, it does not stand down either."""
    async def go() -> None:
        r = Reducer(2.0, lambda: {"a", "b", "c"}, me=me, wait_for_slow="auto")
        for _, ab, (c_second,), c_first, waited in await rounds_with_c_slow(r, classes=UNLIKE):
            assert waited and c_first.included and not c_first.replay and c_second is not None and c_second.included
            assert all(o.count == 3 and not o.step_down for o in ab)
        assert r.late.slow() == {"c"} and r.late.left_out() == set() and r.resting_until == 0
        assert abs((r.late.unlike("c") or 0) - 0.8) < 1e-9
    asyncio.run(go())


@pytest.mark.parametrize("classes", [LIKE, {}, {**UNLIKE, "c": [0, 0, 0, 50]}], ids=["like", "unsaid", "other-length"])
def test_auto_does_not_wait_for_a_slow_node_whose_data_is_like_the_others(classes: dict[str, list[int]]) -> None:
    """Like the others' (or not known: no histogram, or one of another length), a slow node's
    gradients cost only its share of the samples: a and b stop waiting for it, as with "never"."""
    async def go() -> None:
        r = Reducer(2.0, lambda: {"a", "b", "c"}, wait_for_slow="auto")
        waited = [w for *_, w in await rounds_with_c_slow(r, classes=classes)]
        assert waited[0] and not any(waited[-6:]), waited
        assert r.late.left_out() == {"c"}
    asyncio.run(go())


def test_label_distance_is_total_variation_against_the_others_pooled() -> None:
    from p2pnode.partition import distance

    assert distance([1, 1], [[5, 5], [2, 2]]) == 0.0  # proportions, not counts
    assert distance([1, 0], [[0, 3]]) == 1.0
    assert abs((distance([3, 1], [[1, 1], [0, 2]]) or 0) - 0.5) < 1e-12  # pooled [1, 3]: |3/4 - 1/4|
    assert distance([1, 1], []) is None and distance([0, 0], [[1, 1]]) is None
    assert distance([1, 1], [[1, 1, 1]]) is None


def test_the_reducer_forgets_the_times_and_histograms_of_nodes_gone_for_good() -> None:
    """A long-lived reducer meets many nodes: what it keeps per node stays bounded by the
    running ones (and a little slack), not by every node it ever met."""
    from p2pnode.sync.reducer import FORGET_SLACK

    running = {f"n{i:03d}" for i in range(40)}

    async def go() -> None:
        r = Reducer(0.01, lambda: set(running), wait_for_slow="auto")
        for node in sorted(running):  # each alone in a round that closes on the timeout
            await r.contribute(node, 0, -1, f16(1), took=0.05, classes=[1, 2])
        assert len(r.late.classes) == 40  # all running: all kept
        running.clear()
        running.update({"a", "b"})
        for node in ("a", "b"):
            await r.contribute(node, 0, -1, f16(1), took=0.05, classes=[1, 2])
        assert set(r.late.classes) <= {"a", "b"} and set(r.late.seen) <= {"a", "b"}, r.late.classes.keys()
        assert len(r.late.classes) <= 2 + FORGET_SLACK
    asyncio.run(go())


def test_an_outlying_contribution_is_taken_as_the_median_and_honest_rounds_are_as_without_the_check(
        caplog: pytest.LogCaptureFixture) -> None:
    """exchange.sync_outlier (sync/outliers.py): one node's part 100 times the gradient, negated,
    is replaced by the phase's median (counted, named in the log); the same round without it is
    averaged to the same bytes with the check on and off."""
    rng = np.random.default_rng(0)
    g = rng.normal(size=64)
    honest = {n: (g + rng.normal(size=64)).astype("<f2") for n in "abc"}

    async def mean0(parts: dict[str, np.ndarray], outlier: float) -> tuple[bytes, Reducer]:
        r = Reducer(0.5, lambda: set(parts), outlier=outlier)
        first = await asyncio.gather(*(r.contribute(n, 0, -1, p.tobytes()) for n, p in parts.items()))
        assert len({o.data for o in first}) == 1 and all(o.included for o in first)
        return first[0].data, r

    plain, _ = asyncio.run(mean0(honest, 0.0))
    checked, r = asyncio.run(mean0(honest, 8.0))
    assert checked == plain and not r.outliers.by_node and 0 < r.outliers.largest < 2
    attacked = {**honest, "d": (-100 * g).astype("<f2")}
    with caplog.at_level("WARNING", logger="p2pnode.sync"):
        data, r = asyncio.run(mean0(attacked, 8.0))
    stack = np.stack([p.astype(np.float64) for p in attacked.values()])
    median = np.median(stack, axis=0)
    assert values(data) == pytest.approx((stack[:3].sum(axis=0) + median) / 4, rel=1e-3, abs=1e-3)
    assert r.outliers.by_node == {"d": 1} and r.outliers.largest > 20
    assert "node d's contribution to round 0 (phase 0)" in caplog.text and "taken as the median" in caplog.text
    unchecked, _ = asyncio.run(mean0(attacked, 0.0))
    assert float(np.asarray(values(unchecked)) @ g) < 0 < float(np.asarray(values(data)) @ g)
