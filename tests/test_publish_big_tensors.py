"""The publisher's selection of big tensors: an estimated threshold (LDTE-BS) at or above
``EXACT_BELOW`` values, exact top-k below. The share selected stays within the bound, what is
not sent stays owed (x - x_hat), replicas stay bit-equal, and the small CNN's publishes are the
exact top-k ones, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from p2pnode.compression.dgc import DGCSampled
from p2pnode.compression.ldte import LDTEBS
from p2pnode.compression.registry import build_sparsifier
from p2pnode.compression.sized import ESTIMATE_TOL, EXACT_BELOW, SizedTopK, publish_selector
from p2pnode.wire.codec import decode
from p2pnode.wire.payload import ModelSpec
from p2pnode.worker.public import DeltaPublisher, floating_state
from tests.compression.samples import samples

N = EXACT_BELOW  # the smallest tensor that takes the estimated threshold


def data(kind: str, n: int, seed: int) -> torch.Tensor:
    if kind in ("laplace", "gaussian"):
        return samples(kind, n, seed)
    g = torch.Generator().manual_seed(seed)
    # heavy tails (Student-t, 2 degrees of freedom) with a block that did not move at all
    x = torch.randn(n, generator=g) / torch.sqrt(torch.distributions.Chi2(2.0).sample((n,)) / 2)
    x[: n // 3] = 0.0
    return x


@pytest.mark.parametrize("density", [0.1, 0.01])
@pytest.mark.parametrize("kind", ["laplace", "gaussian", "heavy"])
def test_big_tensor_share_within_bound_and_a_threshold(kind: str, density: float) -> None:
    flat = data(kind, N, 1)
    sel = SizedTopK(density)
    idx = sel.select(flat)
    k = round(density * N)
    assert sel.stats["exact"] is False
    assert (1 - ESTIMATE_TOL) * k <= idx.numel() <= (1 + ESTIMATE_TOL) * k
    assert torch.unique(idx).numel() == idx.numel()
    # the largest magnitudes, as exact top-k would choose: nothing left out is bigger
    kept = torch.zeros(N, dtype=torch.bool)
    kept[idx] = True
    assert float(flat.abs()[kept].min()) >= float(flat.abs()[~kept].max())


def test_small_tensor_exact_and_few_moved_all_sent() -> None:
    sel = SizedTopK(0.1)
    small = data("gaussian", N - 1, 2)
    assert torch.equal(torch.sort(sel.select(small)).values,
                       torch.sort(torch.topk(small.abs(), round(0.1 * (N - 1))).indices).values)
    assert sel.stats["exact"] is True
    few = torch.zeros(N)
    few[::50] = torch.randn(few[::50].numel())  # 2 % moved, under k = 10 %
    assert torch.equal(sel.select(few), torch.nonzero(few).reshape(-1))
    few = torch.zeros(N)
    few[::11] = 1.0 + torch.rand(few[::11].numel())  # 9.1 %: just under k, all of it sent
    assert torch.equal(torch.sort(sel.select(few)).values, torch.nonzero(few).reshape(-1))
    ties = torch.ones(N)  # one magnitude everywhere: the search cannot split it, exact k
    assert sel.select(ties).numel() == round(0.1 * N)


def test_first_probe_from_a_sample() -> None:
    """The search starts from a sampled quantile: one counting pass on a residual whose top was
    cut off (what a publish leaves) and on an Adam-like update, where the Laplace key point
    needs several."""
    flat = data("laplace", N, 4)
    cut = torch.where(flat.abs() > 2.0, flat * 0.05, flat)  # the top sent last time, its rounding left
    adam = torch.sign(flat) * (1 + 0.01 * data("gaussian", N, 5))  # lr * m / sqrt(v): about +-lr
    for x in (cut, adam):
        sel = SizedTopK(0.1)
        idx = sel.select(x)
        assert sel.estimated.stats["probes"] == 1
        assert abs(idx.numel() - 0.1 * N) <= ESTIMATE_TOL * 0.1 * N
        laplace = LDTEBS(0.1)
        laplace.select_k(x, round(0.1 * N))  # no start: the Laplace key point first
        assert laplace.stats["probes"] > 1


def test_only_exact_topk_is_replaced() -> None:
    topk = build_sparsifier("topk:density=0.25")
    sized = publish_selector(topk)
    assert isinstance(sized, SizedTopK) and sized.density == 0.25
    dgc = DGCSampled(0.1)
    assert publish_selector(dgc) is dgc


def big_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 1024, bias=False), nn.Linear(1024, 8))  # 1M values, and small


def test_publish_big_tensor_share_and_residual_owed() -> None:
    model = big_model()
    spec = ModelSpec.from_state_dict(floating_state(model), "fp-big")
    pub = DeltaPublisher(model, spec, build_sparsifier("topk:density=0.1"), "me", "e0", 0, "int8")
    assert isinstance(pub.selector, SizedTopK)
    big, k = "0.weight", round(0.1 * N)
    g = torch.Generator().manual_seed(3)
    for v in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.01)
        before = {n: x.clone() for n, x in pub.xhat.items()}
        owed = {n: t.detach().reshape(-1) - before[n] for n, t in floating_state(model).items()}
        delta = decode(pub.publish(v + 1, 1.0), spec)
        assert pub.selector.stats["exact"] is True  # the small tensor comes last
        idx, _ = delta.entries[big]
        assert len(idx) <= (1 + ESTIMATE_TOL) * k
        selected, sent, total = pub.counts
        small = round(0.1 * 8192) + round(0.1 * 8)  # the exact top-k of the second layer
        assert selected - small <= (1 + ESTIMATE_TOL) * k and total == N + 8200
        assert sent <= selected
        # int8 rounding may drop an entry or two, never many: the share sent is near the ratio
        assert len(idx) >= (1 - ESTIMATE_TOL) * k * 0.99
        for name, x in pub.xhat.items():
            q = np.zeros(x.numel(), np.float32)
            if name in delta.entries:
                i, vals = delta.entries[name]
                q[i] = vals
            # x_hat moved by exactly what went on the wire: replicas stay bit-equal
            assert np.array_equal(x.numpy(), before[name].numpy() + q)
            # what was not sent is still owed, unchanged; what was sent leaves at most its
            # rounding error owed (int8: under half a step, never more than the value itself)
            now = (floating_state(model)[name].detach().reshape(-1) - x).numpy()
            unsent = q == 0
            assert np.array_equal(now[unsent], owed[name].numpy()[unsent])
            assert np.all(np.abs(now[~unsent]) <= np.abs(owed[name].numpy()[~unsent]) + 1e-7)
    # the model stops moving: publishes pay what is owed until x_hat is the model (float32)
    pub.value_dtype = "float32"
    for v in range(12):
        pub.publish(10 + v, 1.0)
    for name, x in floating_state(model).items():
        assert torch.equal(pub.xhat[name], x.detach().reshape(-1)), name


def test_cnn_publish_is_exact_topk_byte_for_byte() -> None:
    """Every tensor of the small CNN is under the size: its publishes do not change at all."""
    from p2pnode.models import build_model

    torch.manual_seed(0)
    model = build_model("cnn")
    state = floating_state(model)
    assert max(t.numel() for t in state.values()) < EXACT_BELOW
    spec = ModelSpec.from_state_dict(state, "fp-cnn")
    sized = DeltaPublisher(model, spec, build_sparsifier("topk:density=0.1"), "me", "e0", 0, "int8")
    exact = DeltaPublisher(model, spec, build_sparsifier("topk:density=0.1"), "me", "e0", 0, "int8")
    exact.selector = exact.sparsifier  # torch.topk on every tensor, as before
    g = torch.Generator().manual_seed(5)
    for v in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.01)
        assert sized.publish(v + 1, 0.5) == exact.publish(v + 1, 0.5)


@pytest.mark.parametrize("dtype", ["int8", "float16", "float32"])
def test_a_publish_of_every_entry_sends_a_range_and_keeps_replicas_bit_equal(dtype: str) -> None:
    """top-k at density 1 (an adaptive optimizer's gossip, config/adaptive_gossip.py): every
    entry goes, rounded to the wire's values, zeros and all, its indices one shared range (no
    index array, gather or mask per tensor: these held twice the model's float32 bytes); x_hat
    moves by exactly what the wire carries, and what rounding left behind stays owed."""
    model = big_model()
    spec = ModelSpec.from_state_dict(floating_state(model), "fp-big")
    pub = DeltaPublisher(model, spec, build_sparsifier("topk:density=1.0"), "me", "e0", 0, dtype)
    assert pub.every_entry
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.01)
        model[0].weight[0, :100] = model[0].weight[0, :100] * 0 + pub.xhat["0.weight"][:100].view(1, 100)  # not moved
    before = {n: x.clone() for n, x in pub.xhat.items()}
    delta = decode(pub.publish(1, 1.0), spec)
    for name, x in pub.xhat.items():
        idx, vals = delta.entries[name]
        assert np.array_equal(np.asarray(idx), np.arange(x.numel())), name  # every entry, in order
        assert np.array_equal(x.numpy(), before[name].numpy() + np.asarray(vals, np.float32)), name
        owed = (floating_state(model)[name].detach().reshape(-1) - x).numpy()
        moved = (floating_state(model)[name].detach().reshape(-1) - before[name]).numpy()
        assert np.all(np.abs(owed) <= np.abs(moved) + 1e-7), name  # at most rounding left owed
    assert np.all(np.asarray(delta.entries["0.weight"][1])[:100] == 0)  # the unmoved entries: zeros
    assert pub.counts == (N + 8200, N + 8200, N + 8200)
