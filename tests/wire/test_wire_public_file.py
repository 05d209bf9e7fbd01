"""A big model's x̂ in the worker's file, served by the daemon without a mirror of its own
(wire/public_file.py, ServedModel.attach): the same answers as the mirror, byte for byte; never
half a publish; a file ahead of the log waits for it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from p2pnode.wire import served as served_module
from p2pnode.wire.codec import decode, encode
from p2pnode.wire.genesis import digest
from p2pnode.wire.payload import Delta, ModelSpec, PayloadError, Snapshot, TensorSpec
from p2pnode.wire.public_file import PublicFile, PublicReader
from p2pnode.wire.served import ServedModel

SPEC = ModelSpec("fpF", [TensorSpec("a", (20, 10)), TensorSpec("b", (7,))])


def start() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {s.name: rng.standard_normal(s.numel).astype(np.float32) for s in SPEC.tensors}


def publish(f: PublicFile, version: int, seed: int) -> bytes:
    """What the worker does: x̂ += q in the file between begin and end, then the delta's bytes."""
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(200, 20, replace=False)).astype(np.uint32)
    vals = rng.standard_normal(20).astype(np.float32)
    f.begin()
    f.arrays["a"][idx] += vals
    f.end(version + 1, seed, float(seed))
    return encode(Delta(SPEC.header("delta", "me", "e0", version + 1, base_version=version, step=seed,
                                    loss=float(seed)), {"a": (idx, vals)}))


def pair(tmp_path: Path) -> tuple[PublicFile, ServedModel, ServedModel]:
    x = start()
    f = PublicFile(tmp_path / "public.xhat", SPEC, x, 0)
    on_file = ServedModel(SPEC, "me", "e0", log_size=8)
    on_file.attach(PublicReader(f.path), "e0", 0, digest(x, SPEC))
    mirror = ServedModel(SPEC, "me", "e0", log_size=8)
    mirror.reset(Snapshot(SPEC.header("snapshot", "me", "e0", 0), x))
    return f, on_file, mirror


def test_the_same_answers_as_a_mirror(tmp_path: Path) -> None:
    f, on_file, mirror = pair(tmp_path)
    assert on_file.genesis == mirror.genesis != ""
    for v in range(6):
        data = publish(f, v, seed=v + 1)
        assert on_file.publish(data) == mirror.publish(data) == v + 1
    for since, chain in [(None, False), (0, False), (6, False), (5, False), (3, False), (3, True), (1, False)]:
        a, b = on_file.serve(since, "e0", chain), mirror.serve(since, "e0", chain)
        assert (a.status, a.kind, a.version) == (b.status, b.kind, b.version), since
        assert bytes(a.body) == bytes(b.body), since
    snap = decode(on_file.serve(None, None).body, SPEC)
    assert isinstance(snap, Snapshot) and snap.header.version == 6
    assert np.array_equal(snap.tensors["a"], f.arrays["a"])
    # a genesis named at version 0: the delta since then (merged), as for a replica at 0
    assert on_file.serve(0, None, genesis=mirror.genesis).kind == "delta"


def test_no_mirror_is_kept(tmp_path: Path) -> None:
    _, on_file, _ = pair(tmp_path)
    assert on_file._x == {}


def test_a_file_ahead_of_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker wrote a publish the daemon has not logged yet: a snapshot is of the file's
    version (it needs no delta; the log's next entries continue from it); a merged delta, which
    needs x̂ at the logged version, waits for the log, and is a snapshot if it does not come soon."""
    f, on_file, _ = pair(tmp_path)
    on_file.publish(publish(f, 0, seed=1))
    on_file.publish(publish(f, 1, seed=2))
    data = publish(f, 2, seed=3)  # version 3 in the file, not in the log
    snap = decode(on_file.serve(None, None).body, SPEC)
    assert snap.header.version == 3 and on_file.version == 2
    assert np.array_equal(snap.tensors["a"], f.arrays["a"]) and snap.header.step == 3
    monkeypatch.setattr(served_module, "MERGE_WAIT", 0.05)
    late = on_file.serve(0, "e0")  # never version 3's values labelled 2: a snapshot of 3 instead
    assert (late.kind, late.version) == ("snapshot", 3)
    monkeypatch.setattr(served_module, "MERGE_WAIT", 5.0)
    threading.Timer(0.1, on_file.publish, [data]).start()
    merged = decode(on_file.serve(0, "e0").body, SPEC)
    assert isinstance(merged, Delta) and merged.header.version == 3 and merged.header.base_version == 0
    idx, vals = merged.entries["a"]
    assert np.array_equal(vals, f.arrays["a"][idx])
    assert on_file.serve(3, "e0").status == 304  # the replica made from the snapshot above is current


def test_a_worker_dead_halfway_through_a_publish_gets_503(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f, on_file, _ = pair(tmp_path)
    f.begin()  # and never end()
    monkeypatch.setattr(served_module, "BEHIND_WAIT", 0.05)
    late = on_file.serve(None, None)
    assert (late.status, late.kind) == (503, "unavailable")


def test_a_read_never_sees_half_a_publish(tmp_path: Path) -> None:
    """A writer sets every value to its version, a tensor at a time; every read the reader
    keeps is all one version, the one it asked for."""
    big = ModelSpec("fpB", [TensorSpec("a", (1 << 18,)), TensorSpec("b", (1 << 18,))])
    f = PublicFile(tmp_path / "public.xhat", big, {t.name: np.zeros(t.numel, np.float32) for t in big.tensors}, 0)
    reader = PublicReader(f.path)
    stop = threading.Event()

    def writer() -> None:
        v = 0
        while not stop.is_set():
            f.begin()
            for a in f.arrays.values():
                a[:] = v + 1
            v += 1
            f.end(v, v, 0.0)
            time.sleep(0.01)  # a worker publishes between steps, not flat out

    t = threading.Thread(target=writer)
    t.start()
    kept = 0
    try:
        for _ in range(300):
            _, at, _, _ = reader.state()
            got = reader.read(at)
            if got is None:
                time.sleep(0.001)
                continue
            kept += 1
            assert all(np.all(a == at) for a in got.values())
    finally:
        stop.set()
        t.join()
    assert reader.read(reader.state()[1] + 1) is None  # not at that version
    stop.clear()
    assert kept > 0


def test_a_bad_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x"
    bad.write_bytes(b"not a public file" * 10)
    with pytest.raises(PayloadError):
        PublicReader(bad)
    f = PublicFile(tmp_path / "public.xhat", SPEC, start(), 0)
    with open(f.path, "ab") as out:
        out.write(b"\0" * 4)  # longer than its spec says
    with pytest.raises(PayloadError):
        PublicReader(f.path)
    other = ModelSpec("fpG", SPEC.tensors)
    good = PublicFile(tmp_path / "other.xhat", other, start(), 0)
    with pytest.raises(PayloadError):
        ServedModel(SPEC, "me", "e0").attach(PublicReader(good.path), "e0", 0)


def test_a_new_file_leaves_the_old_one_to_its_reader(tmp_path: Path) -> None:
    """A restarted worker makes the file anew; a daemon still serving the old epoch reads the
    old values, not a truncated file."""
    x = start()
    old = PublicFile(tmp_path / "public.xhat", SPEC, x, 0)
    reader = PublicReader(old.path)
    new = PublicFile(tmp_path / "public.xhat", SPEC, {k: v + 1 for k, v in x.items()}, 0)
    got = reader.read(0)
    assert got is not None and np.array_equal(got["a"], x["a"])
    old.close()  # the old one's removal leaves the new file of that name alone
    assert (tmp_path / "public.xhat").exists()
    new.close()
    assert not (tmp_path / "public.xhat").exists()
