"""A node that missed rounds and steps along them (``ShardTrainer.step_along`` on
``PowerSync.rebuild``, what ``Worker.replay`` does) holds, to the bit, the model of a node that
took them: the same learning rate, clipping, momentum and step count. Real trainers on the
synthetic data, the real reducer."""

from __future__ import annotations

import asyncio

import torch

from p2pnode.config import Config
from p2pnode.sync.powersgd import PowerSync
from p2pnode.sync.reducer import Reducer
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
