"""Replicas kept in files (wire/store.py): bit-equal to replicas in memory through snapshots,
add and set deltas, chains and a genesis start; a refused payload changes nothing; no file
outlives its replica (evicted, replaced, or left over from an earlier worker)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from p2pnode.wire.codec import encode
from p2pnode.wire.payload import Delta, ModelSpec, PayloadError, Snapshot, TensorSpec
from p2pnode.wire.replica import ReplicaCache, ReplicaGap
from p2pnode.wire.store import stash

SPEC = ModelSpec("fpR", [TensorSpec("w", (64, 32)), TensorSpec("b", (32,))])


def snapshot(node: str, version: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    x = {t.name: rng.standard_normal(t.numel).astype(np.float32) for t in SPEC.tensors}
    return encode(Snapshot(SPEC.header("snapshot", node, "e1", version), x))


def delta(node: str, base: int, seed: int, op: str = "add") -> bytes:
    rng = np.random.default_rng(seed)
    entries = {}
    for t in SPEC.tensors:
        idx = np.sort(rng.choice(t.numel, t.numel // 5, replace=False)).astype(np.uint32)
        entries[t.name] = (idx, rng.standard_normal(idx.size).astype(np.float32))
    return encode(Delta(SPEC.header("delta", node, "e1", base + 1, base_version=base, op=op), entries))


def both(tmp_path: Path) -> tuple[ReplicaCache, ReplicaCache]:
    return ReplicaCache(4), ReplicaCache(4, tmp_path / "replicas", disk_from=0)


def same(a: ReplicaCache, b: ReplicaCache, node: str) -> None:
    ra, rb = a.get(node), b.get(node)
    assert ra is not None and rb is not None and (ra.epoch, ra.version) == (rb.epoch, rb.version)
    for t in SPEC.tensors:
        assert np.array_equal(ra.arrays[t.name], rb.arrays[t.name])
        assert np.array_equal(ra.tensors[t.name].numpy(), rb.tensors[t.name].numpy())


def test_file_replicas_equal_memory_replicas_bit_for_bit(tmp_path: Path) -> None:
    mem, disk = both(tmp_path)
    for cache in (mem, disk):
        cache.apply("p", snapshot("p", 3, 1), SPEC)
        cache.apply("p", delta("p", 3, 2), SPEC)
        cache.apply("p", delta("p", 4, 3, op="set"), SPEC)
        cache.apply("p", delta("p", 5, 4) + delta("p", 6, 5), SPEC)
    same(mem, disk, "p")
    assert disk.get("p").version == 7  # type: ignore[union-attr]
    assert len(list((tmp_path / "replicas").glob("*.replica"))) == 1


def test_a_genesis_start_on_disk(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    genesis = {t.name: rng.standard_normal(t.numel).astype(np.float32) for t in SPEC.tensors}
    stashed = stash(tmp_path / "g", "genesis", SPEC, genesis)
    mem, disk = both(tmp_path)
    mem.apply("p", delta("p", 0, 2), SPEC, genesis=genesis)
    disk.apply("p", delta("p", 0, 2), SPEC, genesis=stashed)
    same(mem, disk, "p")
    stashed.close()
    assert not (tmp_path / "g" / "genesis").exists()


def test_refused_payloads_change_nothing_and_leave_no_file(tmp_path: Path) -> None:
    _, disk = both(tmp_path)
    disk.apply("p", snapshot("p", 3, 1), SPEC)
    before = {k: v.copy() for k, v in disk.get("p").arrays.items()}  # type: ignore[union-attr]
    with pytest.raises(ReplicaGap):
        disk.apply("p", delta("p", 7, 2), SPEC)
    bad = bytearray(snapshot("p", 4, 5))
    bad[-9:] = b"\xff" * 9
    with pytest.raises(PayloadError):
        disk.apply("p", bytes(bad), SPEC)
    for k, v in disk.get("p").arrays.items():  # type: ignore[union-attr]
        assert np.array_equal(v, before[k])
    assert len(list((tmp_path / "replicas").glob("*.replica"))) == 1


def test_evicted_and_replaced_replicas_remove_their_files(tmp_path: Path) -> None:
    folder = tmp_path / "replicas"
    folder.mkdir()
    (folder / "old.replica").write_bytes(b"an earlier worker's")
    cache = ReplicaCache(2, folder, disk_from=0)
    assert not (folder / "old.replica").exists()
    for i, node in enumerate("abc"):
        cache.apply(node, snapshot(node, 1, i), SPEC)
    assert "a" not in cache and len(list(folder.glob("*.replica"))) == 2
    cache.apply("c", snapshot("c", 2, 7), SPEC)  # a new snapshot replaces c's file
    assert len(list(folder.glob("*.replica"))) == 2


def test_small_models_stay_in_memory(tmp_path: Path) -> None:
    cache = ReplicaCache(2, tmp_path / "replicas")  # the default threshold: far above this model
    cache.apply("p", snapshot("p", 1, 1), SPEC)
    assert not list((tmp_path / "replicas").glob("*.replica"))
