"""ServedModel: what is served for each `since`, the bounded log, refusal of bad publishes."""

from __future__ import annotations

import threading

import msgpack
import numpy as np
import pytest

from p2pnode.wire.codec import decode, encode
from p2pnode.wire.payload import ArchitectureMismatch, Delta, ModelSpec, PayloadError, Snapshot, TensorSpec
from p2pnode.wire.replica import Replica
from p2pnode.wire.served import ServedModel

SPEC = ModelSpec("fpP", [TensorSpec("a", (10, 10)), TensorSpec("b", (7,))])


def make(log_size: int = 64, log_bytes: int = 1 << 26, epoch: str = "e1") -> ServedModel:
    pub = ServedModel(SPEC, "me", "e0", log_size=log_size, log_bytes=log_bytes)
    rng = np.random.default_rng(0)
    x = {s.name: rng.standard_normal(s.numel).astype(np.float32) for s in SPEC.tensors}
    pub.reset(Snapshot(SPEC.header("snapshot", "me", epoch, 0), x))
    return pub


def delta_bytes(pub: ServedModel, seed: int, k: int = 5, **kw) -> bytes:
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(100, k, replace=False))
    h = dict(base_version=pub.version, loss=float(seed), step=seed)
    h.update(kw)
    version = h["base_version"] + 1
    return encode(Delta(SPEC.header("delta", "me", h.pop("epoch", pub.epoch), version, **h),
                        {"a": (idx, rng.standard_normal(k).astype(np.float32))}))


def replica_at(pub: ServedModel) -> Replica:
    r = Replica(SPEC, "me")
    r.apply(decode(pub.serve(None, None).body, SPEC), validate=False)
    return r


def served_x(pub: ServedModel) -> dict[str, np.ndarray]:
    """x̂ as peers see it: the snapshot the publisher serves."""
    return decode(pub.serve(None, None).body, SPEC).tensors


def same(r: Replica, pub: ServedModel) -> bool:
    x = served_x(pub)
    return all(np.array_equal(r.tensors[k].numpy(), x[k]) for k in x)


def test_unavailable_before_reset() -> None:
    pub = ServedModel(SPEC, "me", "e0")
    res = pub.serve(None, None)
    assert (res.status, res.kind, res.body) == (503, "unavailable", b"")
    with pytest.raises(PayloadError):
        pub.publish(delta_bytes(pub, 1))


def test_reset_adopts_epoch_and_version() -> None:
    pub = make(epoch="e9")
    assert (pub.epoch, pub.version, pub.ready) == ("e9", 0, True)
    res = pub.serve(None, None)
    assert (res.status, res.kind, res.version) == (200, "snapshot", 0)
    assert pub.serve(None, None).snapshot is res.snapshot  # cached per version


def test_304_only_for_same_version_and_epoch() -> None:
    pub = make()
    pub.publish(delta_bytes(pub, 1))
    res = pub.serve(1, "e1")
    assert (res.status, res.body, res.kind, res.version) == (304, b"", "not_modified", 1)
    assert pub.serve(1, "other").kind == "snapshot"
    assert pub.serve(1, None).kind == "snapshot"


def test_newest_delta_served_as_published() -> None:
    pub = make()
    data = delta_bytes(pub, 1)
    pub.publish(data)
    res = pub.serve(0, "e1")
    assert (res.status, res.kind, res.version, res.body) == (200, "delta", 1, data)


def test_merged_delta_is_exact_set_delta() -> None:
    pub = make()
    r = replica_at(pub)
    for seed in range(1, 6):
        pub.publish(delta_bytes(pub, seed))
    res = pub.serve(0, "e1")
    d = decode(res.body, SPEC)
    assert isinstance(d, Delta)
    assert (d.header.op, d.header.base_version, d.header.version) == ("set", 0, 5)
    assert (d.header.loss, d.header.step) == (5.0, 5)  # newest delta's
    assert set(d.entries) == {"a"}
    r.apply(d, validate=False)
    assert same(r, pub) and r.version == 5
    assert pub.serve(0, "e1").body is res.body  # cached


def test_unknown_since_gets_snapshot() -> None:
    pub = make()
    pub.publish(delta_bytes(pub, 1))
    for since in (-5, 2, 10**12, None):
        assert pub.serve(since, "e1").kind == "snapshot"


def test_log_evicted_by_count() -> None:
    pub = make(log_size=3)
    for seed in range(1, 7):
        pub.publish(delta_bytes(pub, seed))
    assert pub.log_len == 3 and pub.version == 6
    assert pub.serve(2, "e1").kind == "snapshot"  # entry 3 (2 -> 3) evicted
    assert pub.serve(3, "e1").kind == "delta"
    assert pub.serve(5, "e1").kind == "delta"


def test_log_evicted_by_bytes() -> None:
    one = len(delta_bytes(make(), 1)) + 5 * 4
    pub = make(log_bytes=2 * one + 10)
    for seed in range(1, 5):
        pub.publish(delta_bytes(pub, seed))
    assert pub.log_len == 2 and pub.log_nbytes <= 2 * one + 10
    assert pub.serve(2, "e1").kind == "delta" and pub.serve(1, "e1").kind == "snapshot"
    # an entry larger than the budget (a big model's delta) is kept alone, without its indices:
    # the newest delta is still served as it is, but nothing is merged across it
    tiny = make(log_bytes=10)
    first = delta_bytes(tiny, 1)
    tiny.publish(first)
    assert tiny.log_len == 1 and tiny.serve(0, "e1").body == first
    second = delta_bytes(tiny, 2)
    tiny.publish(second)
    assert tiny.log_len == 1 and tiny.serve(1, "e1").body == second
    assert tiny.serve(0, "e1").kind == "snapshot"  # the first is gone: no merge across either


def test_bad_publishes_change_nothing() -> None:
    pub = make()
    pub.publish(delta_bytes(pub, 1))
    before, log_len, body = served_x(pub), pub.log_len, pub.serve(0, "e1").body
    other_spec = ModelSpec("zz", SPEC.tensors)
    bad = [
        delta_bytes(pub, 2, base_version=0),  # stale base
        delta_bytes(pub, 2, base_version=5),  # gap
        delta_bytes(pub, 2, epoch="e2"),  # other epoch
        b"\x00garbage",
        delta_bytes(pub, 2)[:-3],
        pub.serve(None, None).body,  # a snapshot is no delta
    ]
    obj = msgpack.unpackb(delta_bytes(pub, 2))
    obj["ver"] = 3  # skips a version
    bad.append(msgpack.packb(obj))
    obj = msgpack.unpackb(delta_bytes(pub, 2))
    obj["op"] = "set"
    bad.append(msgpack.packb(obj))
    obj = msgpack.unpackb(delta_bytes(pub, 2))
    obj["node"] = "someone"
    bad.append(msgpack.packb(obj))
    obj = msgpack.unpackb(delta_bytes(pub, 2))
    v = np.frombuffer(obj["data"][0]["v"], "<f4").copy()
    v[0] = np.nan
    obj["data"][0]["v"] = v.tobytes()
    bad.append(msgpack.packb(obj))
    for data in bad:
        with pytest.raises(PayloadError):
            pub.publish(data)
    with pytest.raises(ArchitectureMismatch):
        pub.reset(encode(Snapshot(other_spec.header("snapshot", "me", "e1", 0),
                                  {s.name: np.zeros(s.numel, np.float32)
                                   for s in SPEC.tensors})))
    after = served_x(pub)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert (pub.version, pub.log_len, pub.serve(0, "e1").body) == (1, log_len, body)


def test_reset_with_new_epoch_drops_log() -> None:
    pub = make()
    pub.publish(delta_bytes(pub, 1))
    pub.reset(pub.serve(None, None).body.replace(b"e1", b"e2", 1))
    assert (pub.epoch, pub.log_len) == ("e2", 0)
    assert pub.serve(0, "e1").kind == "snapshot"


def test_concurrent_publish_and_serve() -> None:
    """One publisher thread, two server threads: every served payload decodes, and a replica
    following them ends equal to x̂."""
    pub = make(log_size=8)
    r = replica_at(pub)
    errors: list[BaseException] = []
    stop = threading.Event()

    def server() -> None:
        try:
            while not stop.is_set():
                res = pub.serve(max(pub.version - 3, 0), "e1")
                if res.status == 200:
                    decode(res.body, SPEC)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=server) for _ in range(2)]
    for t in threads:
        t.start()
    for seed in range(1, 200):
        pub.publish(delta_bytes(pub, seed))
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    r.apply(decode(pub.serve(r.version, r.epoch).body, SPEC), validate=False)
    assert same(r, pub)
