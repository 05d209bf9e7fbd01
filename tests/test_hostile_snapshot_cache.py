"""A flood of snapshot requests (``?since=0``, no epoch) costs one encoding per
``snapshot_max_age``, not one per published version, and a replica built from the reused
(older) snapshot still reaches the current model bit for bit with the next delta."""

from __future__ import annotations

import numpy as np

from p2pnode.wire.codec import decode, encode
from p2pnode.wire.payload import Delta, ModelSpec, Snapshot, TensorSpec
from p2pnode.wire.replica import Replica
from p2pnode.wire.served import ServedModel

SPEC = ModelSpec("fpS", [TensorSpec("a", (10, 10))])


def make(max_age: float, log_size: int = 64) -> ServedModel:
    pub = ServedModel(SPEC, "me", "e1", log_size=log_size, snapshot_max_age=max_age)
    x = {"a": np.random.default_rng(0).standard_normal(100).astype(np.float32)}
    pub.reset(Snapshot(SPEC.header("snapshot", "me", "e1", 0), x))
    return pub


def publish(pub: ServedModel, seed: int) -> None:
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(100, 5, replace=False))
    pub.publish(encode(Delta(SPEC.header("delta", "me", "e1", pub.version + 1, base_version=pub.version),
                             {"a": (idx, rng.standard_normal(5).astype(np.float32))})))


def test_snapshot_reused_across_publishes_and_a_replica_catches_up() -> None:
    pub = make(max_age=60.0)
    first = pub.serve(0, None)
    for seed in range(1, 6):
        publish(pub, seed)
        again = pub.serve(0, None)
        assert again.snapshot is first.snapshot and again.version == 0  # no new encoding
    r = Replica(SPEC, "me")
    r.apply(decode(first.body, SPEC), validate=False)
    catch_up = pub.serve(r.version, "e1")
    assert catch_up.kind == "delta"
    r.apply(decode(catch_up.body, SPEC), validate=False)
    assert r.version == pub.version == 5
    current = Replica(SPEC, "me")
    current.apply(decode(make_fresh_snapshot(pub), SPEC), validate=False)
    assert np.array_equal(r.tensors["a"].numpy(), current.tensors["a"].numpy())


def make_fresh_snapshot(pub: ServedModel) -> bytes:
    pub.snapshot_max_age = 0.0
    res = pub.serve(None, None)
    assert res.version == pub.version
    return res.body


def test_snapshot_not_reused_once_its_version_left_the_log() -> None:
    pub = make(max_age=60.0, log_size=2)
    first = pub.serve(0, None)
    for seed in range(1, 5):
        publish(pub, seed)
    res = pub.serve(0, None)
    assert res.snapshot is not first.snapshot and res.version == 4  # no delta could bring version 0 forward


def test_without_max_age_every_version_gets_its_snapshot() -> None:
    pub = make(max_age=0.0)
    pub.serve(None, None)
    publish(pub, 1)
    assert pub.serve(None, None).version == 1
