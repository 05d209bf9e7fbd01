"""The piggyback queue: retransmit limits, invalidation, ordering, byte budget."""

from __future__ import annotations

from p2pnode.membership.swim.awareness import Awareness
from p2pnode.membership.swim.broadcast import BroadcastQueue, update_size
from p2pnode.config.swim import SwimConfig
from p2pnode.membership.swim.messages import Alive, Dead, Suspect


def test_each_update_is_sent_exactly_limit_times() -> None:
    cfg = SwimConfig.lan()
    for n in (3, 16, 256):
        q = BroadcastQueue(lambda n=n: cfg.retransmit_limit(n))
        q.enqueue(Alive("x", 1, "h:1"))
        sent = 0
        while q:
            sent += len(q.take(10_000))
        assert sent == cfg.retransmit_limit(n)
        assert q.take(10_000) == []


def test_limit_grows_with_log_n() -> None:
    cfg = SwimConfig.lan(retransmit_mult=4)
    assert [cfg.retransmit_limit(n) for n in (1, 9, 10, 99, 100, 999)] == [4, 4, 8, 8, 12, 12]


def test_newer_update_about_a_node_replaces_the_queued_one() -> None:
    q = BroadcastQueue(lambda: 3)
    q.enqueue(Alive("x", 1, "h:1"))
    q.take(10_000)
    q.take(10_000)
    q.enqueue(Suspect("x", 1, "me"))
    assert len(q) == 1 and q.queued("x") == Suspect("x", 1, "me")
    assert q.transmits("x") == 0  # a fresh update gets its full count
    q.enqueue(Dead("x", 1, "me"))
    assert q.take(10_000) == [Dead("x", 1, "me")]


def test_least_sent_first_then_newest_within_budget() -> None:
    q = BroadcastQueue(lambda: 10)
    a, b, c = Alive("a", 0, "h:1"), Alive("b", 0, "h:2"), Alive("c", 0, "h:3")
    q.enqueue(a)
    q.take(10_000)  # a sent once
    q.enqueue(b)
    q.enqueue(c)
    assert q.take(10_000) == [c, b, a]
    # now a was sent twice, b and c once: one slot goes to the newest of the least sent
    size = update_size(a) + 1
    assert q.take(size) == [c]
    assert q.take(size) == [b]
    assert q.take(size) == [c]  # all at two: newest first again


def test_budget_is_respected_and_small_updates_still_fit() -> None:
    q = BroadcastQueue(lambda: 5)
    for i in range(50):
        q.enqueue(Alive(f"node-{i:02d}", i, "10.0.0.1:7070"))
    budget = 200
    batch = q.take(budget)
    assert batch and sum(update_size(u) + 1 for u in batch) <= budget
    assert q.take(10) == []  # nothing fits in 10 bytes


def test_awareness_clamps_and_scales() -> None:
    a = Awareness(max_multiplier=4)
    assert a.scale(1.0) == 1.0
    assert a.apply_delta(10) == 3 and a.scale(0.5) == 2.0
    assert a.apply_delta(-1) == 2 and a.multiplier == 3
    assert a.apply_delta(-10) == 0
