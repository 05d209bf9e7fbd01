"""int8 values on the wire (``compression.value_dtype = "int8"``): the worker's publisher rounds
each delta entry to k * 2**e, adds exactly that to its x_hat, and every replica built from the
wire stays bit-equal to it; what rounding leaves out goes out in later publishes."""

from __future__ import annotations

import torch

from p2pnode.compression.registry import build_sparsifier
from p2pnode.wire.codec import decode
from p2pnode.wire.payload import ModelSpec
from p2pnode.wire.replica import ReplicaCache
from p2pnode.worker.public import DeltaPublisher, floating_state


def publisher(value_dtype: str) -> tuple[torch.nn.Module, ModelSpec, DeltaPublisher]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(200, 100), torch.nn.Linear(100, 10))
    spec = ModelSpec.from_state_dict(floating_state(model), "int8@0")
    pub = DeltaPublisher(model, spec, build_sparsifier("topk:density=0.25"), "peer", "e1", 0, value_dtype)
    return model, spec, pub


def test_replicas_stay_bit_equal_and_x_hat_catches_up() -> None:
    model, spec, pub = publisher("int8")
    replicas = ReplicaCache(2)
    replicas.apply("peer", pub.snapshot(0, 1.0), spec, 1 << 20)
    gen = torch.Generator().manual_seed(1)
    sizes = []
    for step in range(1, 13):
        if step <= 4:  # the model moves, then stands still while x_hat catches up
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        data = pub.publish(step, 1.0)
        assert decode(data, spec).header.value_dtype == "int8"
        sizes.append(len(data))
        replica = replicas.apply("peer", data, spec, 1 << 20)
        for name, x in pub.xhat.items():
            assert torch.equal(torch.as_tensor(replica.tensors[name]).reshape(-1), x)
    gap = max(float((v.reshape(-1) - pub.xhat[k]).abs().max()) for k, v in floating_state(model).items())
    assert gap < 1e-3  # the residual of rounding went out in later publishes (error feedback)
    _, _, pub32 = publisher("float32")
    with torch.no_grad():
        for p in pub32.model.parameters():
            p.add_(0.1)
    assert sizes[0] < 0.6 * len(pub32.publish(1, 1.0))  # ~2 bytes an entry against ~5


def test_a_full_publish_is_float32() -> None:
    model, spec, pub = publisher("int8")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0).add_(0.123)
    data = pub.publish(1, 1.0, full=True)
    assert decode(data, spec).header.value_dtype == "float32"
    for name, v in floating_state(model).items():  # x_hat + (x - x_hat): x up to float32 rounding
        assert torch.allclose(v.reshape(-1), pub.xhat[name], rtol=0, atol=1e-6)
