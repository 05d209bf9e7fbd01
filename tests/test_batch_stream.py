"""A node's batch stream goes on where it was: ``EndlessBatches(skip=k)`` yields what a sampler
that drew k batches would yield next (the same permutations from the same seed), and a trainer
restored from a checkpoint, or moved on by ``seek`` (a synchronous node catching up), draws the
batch the uninterrupted one would. Before, a resumed node started its shard over: with one pass
over the data it saw its first half twice and never its second."""

from __future__ import annotations

import itertools
import multiprocessing as mp

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from worker_pipe import drain

from p2pnode.config import Config, set_option
from p2pnode.pipe_protocol import ADOPT, Applied, PeerPayload
from p2pnode.tasks.loader import EndlessBatches
from p2pnode.wire.codec import encode
from p2pnode.wire.payload import Snapshot
from p2pnode.worker.main import Worker
from p2pnode.worker.public import floating_state
from p2pnode.worker.training import ShardTrainer


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 40), batch=st.integers(1, 12), skip=st.integers(0, 30), seed=st.integers(0, 3))
def test_skipping_k_batches_is_drawing_them(size: int, batch: int, skip: int, seed: int) -> None:
    drawn = list(itertools.islice(iter(EndlessBatches(size, batch, torch.Generator().manual_seed(seed))), skip + 8))
    skipped = list(itertools.islice(iter(EndlessBatches(size, batch, torch.Generator().manual_seed(seed), skip)), 8))
    assert skipped == drawn[skip:]


def trainer() -> ShardTrainer:
    return ShardTrainer(Config.from_dict({"training": {
        "device": "cpu", "data": "synthetic", "synthetic_samples": 400, "batch_size": 32, "shard": "1/2",
        "max_samples": 32 * 40}}))


def same(a: object, b: object) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))  # type: ignore[call-overload]


def test_a_restored_trainer_draws_the_next_batch_not_the_first() -> None:
    a = trainer()
    for _ in range(9):  # past a pass of the shard's 200 items (6 batches of 32)
        a.train_step()
    b = trainer()
    b.load_state_dict(a.state_dict())
    assert b.drawn == a.drawn == 9
    assert same(b._next_batch(), a._next_batch())


def test_seek_moves_the_stream_to_where_a_trainer_that_drew_that_many_is() -> None:
    a, b = trainer(), trainer()
    first = b._next_batch()
    for _ in range(13):
        a._next_batch()
    b.seek(13)
    assert same(b._next_batch(), a._next_batch()) and not same(first, a._next_batch())


def test_a_synchronous_catch_up_takes_the_models_step_count_ahead_or_behind(tmp_path) -> None:
    """A node catching up in the synchronous mode takes a running node's model whole and its
    step count with it. Behind it, the count moves on; ahead of it (local steps taken while the
    node was told it was behind) it moves back: a count ahead ends training early, and the
    models' mean after training then takes a model that many steps old (measured: 1 pt lost
    when the restarted node was the reducer)."""
    cfg = Config()
    for key, value in {"training.data": "synthetic", "training.synthetic_samples": "512", "training.eval_every": "0",
                       "exchange.sync": "powersgd", "node.state_dir": str(tmp_path)}.items():
        set_option(cfg, key, value)
    cfg = Config.from_dict(cfg.to_dict())
    ours, theirs = mp.Pipe()
    worker = Worker(ours, cfg, "me")
    applied, reader = drain(theirs, Applied)  # the adopted model is published whole on the pipe
    tensors = {k: v.detach().numpy().astype(np.float32).ravel().copy()
               for k, v in floating_state(worker.trainer.model).items()}
    t = worker.trainer
    for version, (ours_at, theirs_at) in enumerate([(10, 30), (40, 25)], start=1):
        t.step, t.samples = ours_at, ours_at * cfg.training.batch_size
        t.seek(ours_at)
        body = encode(Snapshot(worker.spec.header("snapshot", "peer", "ep", version, step=theirs_at), tensors))
        worker.on_peer(PeerPayload(token=version, peer="peer", data=body, mode=ADOPT))
        assert (t.step, t.drawn, t.samples) == (theirs_at, theirs_at, theirs_at * cfg.training.batch_size)
    ours.close()
    reader.join(10)
    assert len(applied) == 2 and all(a.ok for a in applied), applied
