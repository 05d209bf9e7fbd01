"""Low-rank publishes (compression.publish_rank, wire/lowrank.py): the factors' wire entry, the
refusal of malformed ones, and bit-equality of the publisher's x̂, the daemon's served copy and
a peer's replica across publishes, merged answers and chains."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch

from p2pnode.compression.registry import build_sparsifier
from p2pnode.models import SmallCNN, fingerprint
from p2pnode.wire import lowrank
from p2pnode.wire.codec import Delta, ModelSpec, PayloadError, TensorSpec, decode, encode
from p2pnode.wire.replica import Replica, ReplicaCache
from p2pnode.wire.served import ServedModel
from p2pnode.worker.public import DeltaPublisher, floating_state

SPEC = ModelSpec("fpL", [TensorSpec("w", (40, 30)), TensorSpec("b", (40,))])


def low_rank_change(rank: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((40, rank)) @ rng.standard_normal((rank, 30))).astype(np.float32).reshape(-1)


def test_factorize_recovers_a_low_rank_change_and_product_is_what_the_entry_says() -> None:
    d = low_rank_change(3)
    f = lowrank.factorize(d, (40, 30), 3)
    assert f is not None and f.rank == 3 and f.a.dtype == np.int8
    approx = f.product()
    # int8 factors: a relative error of a few percent of the change, no more
    assert np.linalg.norm(approx - d) / np.linalg.norm(d) < 0.03
    # rank 1 of a rank-3 change keeps its largest component only
    one = lowrank.factorize(d, (40, 30), 1)
    assert one is not None and np.linalg.norm(one.product() - d) > np.linalg.norm(approx - d)
    assert lowrank.factorize(np.zeros(1200, np.float32), (40, 30), 3) is None


def test_which_tensors_are_worth_factoring() -> None:
    assert lowrank.worth_factoring((128, 3136), 8)
    assert lowrank.worth_factoring((64, 32, 3, 3), 8)  # viewed as 64 x 288
    assert not lowrank.worth_factoring((32, 1, 3, 3), 8)  # 32 x 9: narrower than the rank
    assert not lowrank.worth_factoring((10, 128), 8)  # factors would cost more than half of it
    assert not lowrank.worth_factoring((128,), 8)
    assert not lowrank.worth_factoring((128, 3136), 0)


def factor_delta(rank: int = 3, base: int = 0) -> Delta:
    f = lowrank.factorize(low_rank_change(rank), (40, 30), rank)
    header = SPEC.header("delta", "me", "e0", base + 1, base_version=base)
    return Delta(header, {"b": (np.array([1, 5]), np.array([0.5, -1.0], np.float32))}, {"w": f})


@pytest.mark.parametrize("vdt", ["float32", "float16", "int8"])
def test_factor_entry_round_trips_beside_sparse_entries(vdt: str) -> None:
    delta = factor_delta()
    back = decode(encode(delta, value_dtype=vdt), SPEC)
    assert isinstance(back, Delta) and set(back.factors) == {"w"} and set(back.entries) == {"b"}
    f, g = delta.factors["w"], back.factors["w"]
    assert np.array_equal(f.a, g.a) and np.array_equal(f.b, g.b) and np.array_equal(f.e, g.e)
    assert np.array_equal(f.product(), g.product())


def test_encoder_refuses_factors_it_could_not_decode() -> None:
    good = factor_delta()
    f = good.factors["w"]
    with pytest.raises(ValueError, match="set delta"):
        h = SPEC.header("delta", "me", "e0", 1, base_version=0, op="set")
        encode(Delta(h, {}, {"w": f}))
    with pytest.raises(ValueError, match="both"):
        encode(Delta(good.header, {"w": (np.array([0]), np.array([1.0], np.float32))}, {"w": f}))
    with pytest.raises(ValueError, match="not fit"):
        encode(Delta(good.header, {}, {"w": lowrank.Factors(f.a[:, :10], f.b, f.e)}))


def tampered(change) -> bytes:
    obj = msgpack.unpackb(encode(factor_delta()), raw=False)
    entry = next(e for e in obj["data"] if "r" in e)
    change(entry, obj)
    return msgpack.packb(obj, use_bin_type=True)


@pytest.mark.parametrize("change, reason", [
    (lambda e, o: e.update(r=0), "rank"),
    (lambda e, o: e.update(r=65), "rank"),
    (lambda e, o: e.update(r=30), "rank"),  # 30 x (40 + 30) > 40 x 30 entries: larger than the tensor
    (lambda e, o: e.update(r=True), "rank"),
    (lambda e, o: e.update(a=e["a"][:-1]), "bytes"),
    (lambda e, o: e.update(b=e["b"] + b"\0"), "bytes"),
    (lambda e, o: e.update(a="text"), "bytes"),
    (lambda e, o: e.update(e=e["e"][:-1]), "exponents"),
    (lambda e, o: e.update(e=[10**6] * e["r"]), "exponents"),
    (lambda e, o: e.update(e=[1.5] * e["r"]), "exponents"),
    (lambda e, o: e.update(t=1), "not a matrix"),  # factors for the vector b
    (lambda e, o: o.update(op="set"), "bad delta entry"),  # factors only add
])
def test_decoder_refuses_malformed_factor_entries(change, reason: str) -> None:
    with pytest.raises(PayloadError, match=reason):
        decode(tampered(change), SPEC)


def test_worst_case_factors_stay_finite() -> None:
    r = 8
    f = lowrank.Factors(np.full((r, 40), 127, np.int8), np.full((r, 30), -128, np.int8),
                        np.full(r, lowrank.EXPONENTS[1], np.int64))
    back = decode(encode(Delta(SPEC.header("delta", "me", "e0", 1, base_version=0), {}, {"w": f})), SPEC)
    assert np.isfinite(back.factors["w"].product()).all()


def cnn_publisher(rank: int) -> tuple[torch.nn.Module, DeltaPublisher, ModelSpec]:
    torch.manual_seed(0)
    model = SmallCNN()
    spec = ModelSpec.from_state_dict(floating_state(model), fingerprint(model))
    pub = DeltaPublisher(model, spec, build_sparsifier("topk:density=0.1"), "me", "e0", 0, "int8", rank=rank)
    return model, pub, spec


def train_a_little(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def test_publisher_served_copy_and_replicas_stay_bit_equal() -> None:
    model, pub, spec = cnn_publisher(rank=4)
    assert set(pub.factored) == {"features.3.weight", "classifier.1.weight", "classifier.3.weight"}
    start = {k: v.clone() for k, v in pub.xhat.items()}
    served = ServedModel(spec, "me", "e0")
    served.reset(pub.snapshot(0, 1.0))
    step_by_step = ReplicaCache(2)
    step_by_step.apply("me", served.serve(None, None).body, spec)
    behind = ReplicaCache(2)  # fetches every third publish: a merged "set" answer
    behind.apply("me", served.serve(None, None).body, spec)
    chained = ReplicaCache(2)  # the same, asking for chains: the factors as published
    chained.apply("me", served.serve(None, None).body, spec)
    for step in range(1, 7):
        train_a_little(model, step)
        data = pub.publish(step, 1.0)
        assert decode(data, spec).factors, "the matrices go as factors"
        served.publish(data)
        step_by_step.apply("me", served.serve(served.version - 1, "e0").body, spec)
        if step % 3 == 0:
            for cache, chain in ((behind, False), (chained, True)):
                r = cache.get("me")
                answer = served.serve(r.version, r.epoch, chain=chain)
                assert answer.kind == ("chain" if chain else "delta")
                cache.apply("me", answer.body, spec)
    want = {k: v.numpy() for k, v in pub.xhat.items()}
    for cache in (step_by_step, behind, chained):
        got = cache.get("me").arrays
        assert all(np.array_equal(got[k], want[k]) for k in want)
    # and x̂ followed the model: what is left unsent is a small part of the change
    now = {k: v.detach().reshape(-1) for k, v in floating_state(model).items()}
    left = sum(float((now[k] - pub.xhat[k]).norm() ** 2) for k in now) ** 0.5
    moved = sum(float((now[k] - start[k]).norm() ** 2) for k in now) ** 0.5
    assert left < 0.5 * moved


def test_a_rank_publish_is_smaller_than_top_k_for_the_same_change() -> None:
    sizes = {}
    for rank in (0, 8):
        model, pub, _ = cnn_publisher(rank)
        train_a_little(model, 1)
        sizes[rank] = len(pub.publish(1, 1.0))
    assert sizes[8] < sizes[0] / 2, sizes


def test_replica_refuses_factors_for_the_wrong_base_and_keeps_its_values() -> None:
    r = Replica(SPEC, "me")
    from p2pnode.wire.codec import Snapshot
    x = {"w": np.zeros(1200, np.float32), "b": np.zeros(40, np.float32)}
    r.apply(Snapshot(SPEC.header("snapshot", "me", "e0", 0), x))
    with pytest.raises(PayloadError):
        r.apply(factor_delta(base=3))
    assert not r.arrays["w"].any()
    r.apply(factor_delta(base=0))
    assert np.array_equal(r.arrays["w"], factor_delta().factors["w"].product())
