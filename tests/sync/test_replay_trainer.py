"""A node that missed rounds and steps along them (``ShardTrainer.step_along`` on
``PowerSync.rebuild``, what ``AllReduce.replay`` does) holds, to the bit, the model of a node
that took them: the same learning rate, clipping, momentum and step count; and a slow node
late for a round's phase 1 (``sync/worker_allreduce.py``) steps along the same mean. Real trainers
on the synthetic data, the real reducer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
import torch

from p2pnode.config import Config
from p2pnode.sync.lateness import WARMUP
from p2pnode.sync.messages import SyncResult
from p2pnode.sync.worker_powersgd import PowerSync
from p2pnode.sync.reducer import Reducer
from p2pnode.sync.worker_allreduce import AllReduce
from p2pnode.worker.training import ShardTrainer


def trainer(shard: str) -> ShardTrainer:
    return ShardTrainer(Config.from_dict({"training": {
        "device": "cpu", "data": "synthetic", "synthetic_samples": 512, "warmup_samples": 64, "lr": 0.05,
        "batch_size": 32, "shard": shard, "max_samples": 32 * 40, "lr_schedule": "cosine"}}))


def test_a_node_replaying_the_rounds_it_missed_holds_the_same_model_to_the_bit() -> None:
    a, b = trainer("0/2"), trainer("1/2")
    sa, sb = (PowerSync(list(t.model.named_parameters()), 2, 0) for t in (a, b))
    loop = asyncio.new_event_loop()
    red = Reducer(0.5, lambda: {"a"})  # a alone makes every round; b only ever replays them

    def a_reduces() -> bool:
        grads = {n: p.grad for n, p in a.model.named_parameters() if p.grad is not None}
        first = loop.run_until_complete(red.contribute("a", 0, sa.q_round, sa.phase0(grads)))
        second = loop.run_until_complete(red.contribute("a", 1, first.round, sa.phase1(first.data)))
        mean = sa.finish(second.data, second.round, second.included)
        with torch.no_grad():
            for n, g in grads.items():
                g.copy_(mean[n].view_as(g))
        return True

    def b_replays() -> bool:
        grads = {n: p.grad for n, p in b.model.named_parameters() if p.grad is not None}
        sb.phase0(grads)  # computed, then too late: the rounds it missed instead
        out = loop.run_until_complete(red.contribute("b", 0, sb.q_round, b"\0\0"))
        assert out.replay and not out.included
        b.drop_step()
        with torch.no_grad():
            for rnd, m0, m1 in out.replay:
                b.step_along(sb.rebuild(m0, m1, rnd))
        return False

    def same() -> bool:
        return all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))

    a.train_step(a_reduces)  # round 0: b takes it from the reducer as it starts (no gradient of its own yet)
    b.step_along(sb.rebuild(red.closed[(0, 0)][0], red.closed[(0, 1)][0], 0))
    assert same() and b.step == a.step
    for i in range(12):
        a.train_step(a_reduces)
        if i % 3 == 2:  # b misses three rounds at a time
            b.train_step(b_replays)
            assert same() and (b.step, b.samples) == (a.step, a.samples), i
    ma = a.optimizer.state_dict()["state"]
    mb = b.optimizer.state_dict()["state"]
    assert all(torch.equal(ma[k]["momentum_buffer"], mb[k]["momentum_buffer"]) for k in ma)
    loop.close()


def until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@pytest.mark.parametrize("in_phase1", [True, False])
def test_a_slow_node_in_phase_zero_but_late_for_phase_one_drops_that_gradient(in_phase1: bool) -> None:
    """b is slow (not waited for) but its phase 0 makes the round; phase 1 closes without it
    unless it comes first. Late for it, b steps along the same mean and drops that step's
    gradient (its error feedback as before: no pile of late gradients). Either way b ends on
    a's model, momentum and step, to the bit."""
    a, b = trainer("0/2"), trainer("1/2")
    sa, sb = (PowerSync(list(t.model.named_parameters()), 2, 0) for t in (a, b))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    red = Reducer(5.0, lambda: {"a", "b"})
    for _ in range(WARMUP + 5):
        red.late.came("a", 0.05)
        red.late.came("b", 0.2)

    def call(node: str, phase: int, rnd: int, data: bytes) -> SyncResult:
        out = asyncio.run_coroutine_threadsafe(red.contribute(node, phase, rnd, data), loop).result(10)
        return SyncResult(phase=phase, round=out.round, data=out.data, count=out.count, included=out.included,
                          replay=[list(r) for r in out.replay])

    def a_reduces() -> bool:
        grads = {n: p.grad for n, p in a.model.named_parameters() if p.grad is not None}
        first = call("a", 0, sa.q_round, sa.phase0(grads))
        if in_phase1 and "b" in red.closed[(first.round, 0)][1]:
            until(lambda: "b" in getattr(red.open1.get(first.round), "parts", ()), "b's phase 1")
        second = call("a", 1, first.round, sa.phase1(first.data))
        mean = sa.finish(second.data, second.round, second.included)
        with torch.no_grad():
            for n, g in grads.items():
                g.copy_(mean[n].view_as(g))
        return True

    def b_phase(phase: int, rnd: int, data: bytes, took: float) -> SyncResult:
        if phase == 1 and not in_phase1:
            until(lambda: (rnd, 1) in red.closed, "a's phase 1")
        return call("b", phase, rnd, data)

    a.train_step(a_reduces)  # round 0: b takes it from the reducer as it starts
    b.step_along(sb.rebuild(red.closed[(0, 0)][0], red.closed[(0, 1)][0], 0))
    err_before = {n: e.clone() for n, e in sb.err.items()}
    results: list[bool | None] = []
    hook = AllReduce(b, sb, b_phase)

    def b_hook() -> bool | None:
        results.append(hook())
        return results[-1]

    b_steps = threading.Thread(target=b.train_step, args=(b_hook,))
    b_steps.start()  # b's phase 0 comes first and waits in round 1; then a's closes it
    until(lambda: red.open0 is not None and "b" in red.open0.parts, "b's phase 0")
    a.train_step(a_reduces)
    b_steps.join(10)
    assert results == [True] and red.closed[(1, 0)][1] == {"a", "b"}
    assert ("b" in red.closed[(1, 1)][1]) == in_phase1
    kept = [torch.equal(sb.err[n], err_before[n]) for n in sb.err]
    assert all(kept) != in_phase1  # out of phase 1: that gradient dropped, the error feedback as before
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    assert (b.step, b.samples) == (a.step, a.samples)
    ma, mb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(ma[k]["momentum_buffer"], mb[k]["momentum_buffer"]) for k in ma)
    loop.call_soon_threadsafe(loop.stop)
