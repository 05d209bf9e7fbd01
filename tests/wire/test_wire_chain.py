"""Chained answers (``GET /v1/model?since=V&chain=1``): a peer several publishes behind gets the
deltas as published, back to back, when that is smaller than one merged float32 "set" delta,
so float16 and int8 values stay what they were; the replica cache splits and applies them, and
refuses a chain that does not follow on without changing anything."""

from __future__ import annotations

import numpy as np
import pytest

from p2pnode.wire.codec import MAX_CHAIN, encode, split_chain
from p2pnode.wire.payload import Delta, ModelSpec, PayloadError, Snapshot, TensorSpec
from p2pnode.wire.rounding import round_int8
from p2pnode.wire.replica import ReplicaCache, ReplicaGap
from p2pnode.wire.served import ServedModel

SPEC = ModelSpec("fpC", [TensorSpec("w", (200, 50)), TensorSpec("b", (50,))])
NODE = "pub"


def setup(value_dtype: str, publishes: int, density: float = 0.1) -> tuple[ServedModel, dict, list[bytes]]:
    rng = np.random.default_rng(0)
    x = {s.name: rng.standard_normal(s.numel).astype(np.float32) for s in SPEC.tensors}
    pub = ServedModel(SPEC, NODE, "e0")
    pub.reset(Snapshot(SPEC.header("snapshot", NODE, "e1", 0), {k: v.copy() for k, v in x.items()}))
    sent = []
    for v in range(publishes):
        entries = {}
        for s in SPEC.tensors:
            idx = np.sort(rng.choice(s.numel, int(s.numel * density), replace=False))
            vals = (rng.standard_normal(idx.size) * 0.01).astype(np.float32)
            if value_dtype == "int8":
                vals = round_int8(vals)
            elif value_dtype == "float16":
                vals = vals.astype(np.float16).astype(np.float32)
            x[s.name][idx] += vals
            entries[s.name] = (idx, vals)
        data = encode(Delta(SPEC.header("delta", NODE, "e1", v + 1, base_version=v, step=v), entries), value_dtype)
        pub.publish(data)
        sent.append(data)
    return pub, x, sent


def follower_at(version: int, sent: list[bytes]) -> ReplicaCache:
    rng = np.random.default_rng(0)
    x0 = {s.name: rng.standard_normal(s.numel).astype(np.float32) for s in SPEC.tensors}
    cache = ReplicaCache(2)
    cache.apply(NODE, encode(Snapshot(SPEC.header("snapshot", NODE, "e1", 0), x0)), SPEC)
    for data in sent[:version]:
        cache.apply(NODE, data, SPEC)
    return cache


@pytest.mark.parametrize("value_dtype", ["int8", "float16"])
def test_chain_served_smaller_and_replica_bit_equal(value_dtype: str) -> None:
    pub, x, sent = setup(value_dtype, 5)
    merged = pub.serve(2, "e1")
    chained = pub.serve(2, "e1", chain=True)
    assert merged.kind == "delta" and chained.kind == "chain" and chained.version == 5
    assert len(chained.body) < len(merged.body)
    assert chained.body == b"".join(sent[2:])  # the deltas exactly as published
    # streamed from the logged deltas themselves: no joined copy of a big chain in the daemon
    assert chained.snapshot is not None and [bytes(p) for p in chained.snapshot.parts] == sent[2:]
    cache = follower_at(2, sent)
    replica = cache.apply(NODE, chained.body, SPEC)
    assert replica.version == 5
    assert all(np.array_equal(replica.arrays[k], x[k]) for k in x)


def test_float32_deltas_that_overlap_are_merged() -> None:
    pub, _, _ = setup("float32", 3, density=0.9)  # 90 % each: the union is smaller than three
    assert pub.serve(0, "e1", chain=True).kind == "delta"


def test_newest_delta_is_a_chain_of_one() -> None:
    pub, _, sent = setup("int8", 3)
    assert pub.serve(2, "e1", chain=True).body == sent[2]
    assert split_chain(sent[2]) == [sent[2]]


def test_a_chain_that_does_not_follow_on_changes_nothing() -> None:
    _, x, sent = setup("int8", 5)
    cache = follower_at(2, sent)
    before = {k: v.copy() for k, v in cache.get(NODE).arrays.items()}
    for bad in (sent[2] + sent[4],  # a gap inside
                sent[3] + sent[4],  # does not start where the replica is
                sent[2] + sent[3][:-5]):  # cut short
        with pytest.raises((PayloadError, ReplicaGap)):
            cache.apply(NODE, bad, SPEC)
        replica = cache.get(NODE)
        assert replica.version == 2 and all(np.array_equal(replica.arrays[k], before[k]) for k in before)
    with pytest.raises(PayloadError, match="payloads in one answer"):
        split_chain(sent[0] * (MAX_CHAIN + 1))
    with pytest.raises(PayloadError, match="too large"):
        cache.apply(NODE, sent[2] + sent[3], SPEC, max_bytes=len(sent[2]))
