"""Replica and ReplicaCache: application rules, gaps, and refusal leaving state untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from p2pnode.wire.codec import encode
from p2pnode.wire.payload import (
    ArchitectureMismatch,
    Delta,
    ModelSpec,
    NonFiniteError,
    PayloadError,
    Snapshot,
    TensorSpec,
)
from p2pnode.wire.replica import Replica, ReplicaCache, ReplicaGap

SPEC = ModelSpec("fpR", [TensorSpec("w", (4, 5)), TensorSpec("b", (5,))])


def snap(node: str = "p", epoch: str = "e1", version: int = 3, seed: int = 0) -> Snapshot:
    rng = np.random.default_rng(seed)
    x = {s.name: rng.standard_normal(s.numel).astype(np.float32) for s in SPEC.tensors}
    return Snapshot(SPEC.header("snapshot", node, epoch, version, loss=1.5, step=9), x)


def dlt(base: int = 3, node: str = "p", epoch: str = "e1", op: str = "add",
        idx=(1, 4), vals=(0.5, -2.0)) -> Delta:
    return Delta(SPEC.header("delta", node, epoch, base + 1, base_version=base, op=op,
                             loss=0.5, step=10),
                 {"w": (np.array(idx), np.array(vals, np.float32))})


def state(r: Replica) -> tuple:
    return (r.epoch, r.version, r.loss, r.step,
            {k: t.clone() for k, t in r.tensors.items()})


def assert_same(a: tuple, b: tuple) -> None:
    assert a[:4] == b[:4] or (a[:2] == b[:2] and a[3] == b[3])  # nan loss before snapshot
    assert a[4].keys() == b[4].keys()
    assert all(torch.equal(a[4][k], b[4][k]) for k in a[4])


def test_snapshot_then_add_and_set() -> None:
    r = Replica(SPEC, "p")
    assert not r.ready and r.version == -1
    s = snap()
    r.apply(s)
    assert (r.epoch, r.version, r.loss, r.step) == ("e1", 3, 1.5, 9)
    assert r.tensors["w"].dtype == torch.float32 and r.tensors["w"].shape == (20,)
    r.apply(dlt())
    expect = s.tensors["w"].copy()
    expect[[1, 4]] += np.array([0.5, -2.0], np.float32)
    assert np.array_equal(r.tensors["w"].numpy(), expect)
    r.apply(dlt(base=4, op="set", idx=(0,), vals=(7.0,)))
    assert r.tensors["w"][0].item() == 7.0 and r.version == 5


def test_gaps_and_mismatches_change_nothing() -> None:
    r = Replica(SPEC, "p")
    with pytest.raises(ReplicaGap):
        r.apply(dlt())  # no snapshot yet
    r.apply(snap())
    before = state(r)
    bad = [
        (dlt(base=2), ReplicaGap),
        (dlt(base=4), ReplicaGap),
        (dlt(epoch="e2"), ReplicaGap),
        (dlt(node="q"), PayloadError),
        (dlt(idx=(3, 20)), PayloadError),  # out of range
        (dlt(idx=(4, 1)), PayloadError),  # not increasing
        (dlt(vals=(np.nan, 1.0)), PayloadError),
        (snap(node="q"), PayloadError),
    ]
    other = snap()
    other.header.fingerprint = "else"
    bad.append((other, ArchitectureMismatch))
    bad_values = snap(seed=1)
    bad_values.tensors["b"][2] = np.inf
    bad.append((bad_values, PayloadError))
    for payload, exc in bad:
        with pytest.raises(exc):
            r.apply(payload)
        assert_same(state(r), before)


def held(cache: ReplicaCache, node_id: str) -> tuple[str | None, int] | None:
    r = cache.get(node_id)
    return None if r is None else (r.epoch, r.version)


def test_cache_apply_lru() -> None:
    cache = ReplicaCache(2)
    assert held(cache, "p") is None
    cache.apply("p", encode(snap("p")), SPEC)
    cache.apply("q", encode(snap("q", version=0)), SPEC)
    assert held(cache, "p") == ("e1", 3)
    r = cache.apply("p", encode(dlt()), SPEC)
    assert r.version == 4 and cache.get("p") is r
    cache.apply("s", encode(snap("s")), SPEC)  # evicts q, the least recently used
    assert "q" not in cache and "p" in cache and len(cache) == 2


def test_cache_refusals_change_nothing() -> None:
    cache = ReplicaCache(4)
    cache.apply("p", encode(snap("p")), SPEC)
    before = state(cache.get("p"))
    cases = [
        (encode(dlt(base=7)), ReplicaGap),
        (encode(dlt(node="q")), PayloadError),  # payload from another node than asked
        (b"\xff" * 10, PayloadError),
        (encode(snap("p"))[:-1], PayloadError),
        (encode(snap("p")), PayloadError),  # too large for max_bytes below
    ]
    for i, (data, exc) in enumerate(cases):
        with pytest.raises(exc):
            cache.apply("p", data, SPEC, max_bytes=200 if i == 4 else 10**6)
        assert_same(state(cache.get("p")), before)
    obj = encode(dlt()).replace(b"fpR", b"fpX")
    with pytest.raises(ArchitectureMismatch):
        cache.apply("p", obj, SPEC)
    with pytest.raises(ReplicaGap):
        cache.apply("new", encode(dlt(node="new")), SPEC)
    assert "new" not in cache
    nan = snap("p", seed=2)
    data = bytearray(encode(nan))
    pos = data.index(nan.tensors["b"].tobytes())
    data[pos:pos + 4] = np.array([np.nan], "<f4").tobytes()
    with pytest.raises(NonFiniteError):
        cache.apply("p", bytes(data), SPEC)
    assert_same(state(cache.get("p")), before)


def test_cache_snapshot_replaces_with_new_epoch() -> None:
    cache = ReplicaCache(1)
    old = cache.apply("p", encode(snap("p")), SPEC)
    kept = old.tensors["w"]
    new = cache.apply("p", encode(snap("p", epoch="e2", version=0, seed=5)), SPEC)
    assert held(cache, "p") == ("e2", 0) and new is cache.get("p")
    assert torch.equal(kept, torch.from_numpy(snap().tensors["w"]))  # old object untouched
