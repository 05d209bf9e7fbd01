"""BatchNorm running statistics pooled when a peer's model is averaged into ours (gossip,
worker/averaging.py ``average_into``): the variance taken is that of the two nodes' data
together, E[x^2] - mean^2 over both, not the mean of the two variances, which loses the spread
between the nodes' means (label-skewed shards: each node's features have their own mean).

The statistics here are those of real synthetic data sets, computed with numpy; the pooled
result is checked against the statistics of their union."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from p2pnode.models import build_model
from p2pnode.worker.averaging import average_into, peer_weight, relative_distance
from p2pnode.worker.public import KEEP_LOCAL, floating_state
from p2pnode.worker.robust import ClipRadius

CHANNELS = 5


def bn_model() -> nn.Sequential:
    """Linear, BatchNorm, ReLU, Linear (a BatchNorm inside a Sequential: names ``1.running_*``)."""
    return nn.Sequential(nn.Linear(3, CHANNELS), nn.BatchNorm1d(CHANNELS), nn.ReLU(), nn.Linear(CHANNELS, 2))


def data(seed: int, n: int, shift: float) -> np.ndarray:
    """``n`` samples of CHANNELS features, each channel its own scale, the whole set shifted:
    one node's skewed shard."""
    rng = np.random.default_rng(seed)
    return rng.normal(shift, 1.0, size=(n, CHANNELS)) * rng.uniform(0.5, 2.0, size=CHANNELS) + shift


def with_statistics(x: np.ndarray, seed: int) -> nn.Sequential:
    """A model (weights from ``seed``) whose BatchNorm holds ``x``'s per-channel mean and variance."""
    torch.manual_seed(seed)
    model = bn_model()
    norm = model[1]
    with torch.no_grad():
        norm.running_mean.copy_(torch.from_numpy(x.mean(axis=0)))
        norm.running_var.copy_(torch.from_numpy(x.var(axis=0)))
    return model


def replica(model: nn.Module) -> dict[str, torch.Tensor]:
    """What a node holds of a peer's model: flat float32 tensors keyed by the sent names."""
    return {k: v.detach().clone().float().reshape(-1) for k, v in floating_state(model).items()}


def test_pooled_variance_is_the_variance_of_both_data_sets_together() -> None:
    ours_x, theirs_x = data(0, 300, -1.5), data(1, 100, 2.0)
    ours, theirs = with_statistics(ours_x, 0), with_statistics(theirs_x, 1)
    peer = replica(theirs)
    plain_var = 0.75 * ours[1].running_var.clone() + 0.25 * peer["1.running_var"]
    weights_before = {k: v.clone() for k, v in ours.state_dict().items() if "running" not in k}
    average_into(ours, peer, 0.25)  # the peer's share of the union: 100 of 400 samples
    union = np.concatenate([ours_x, theirs_x])
    norm = ours[1]
    np.testing.assert_allclose(norm.running_mean.numpy(), union.mean(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(norm.running_var.numpy(), union.var(axis=0), rtol=1e-5, atol=1e-5)
    assert bool(torch.all(plain_var < norm.running_var - 0.5))  # the means are 3.5 apart: the spread counts
    for name, before in weights_before.items():  # weights and the count averaged as before
        if before.is_floating_point():
            expected = 0.75 * before + 0.25 * peer[name].view_as(before)
            assert torch.allclose(ours.state_dict()[name], expected, atol=1e-6), name
        else:
            assert torch.equal(ours.state_dict()[name], before), name  # num_batches_tracked: local


def test_a_round_of_three_peers_pools_all_four_data_sets() -> None:
    """exchange.peers_per_round = 3 under "mean": payload n weighs 1/(n+1); pooled one after the
    other, the four nodes' statistics end as those of their four data sets together."""
    sets = [data(10 + i, 200, shift) for i, shift in enumerate((-3.0, -1.0, 0.5, 4.0))]
    ours = with_statistics(sets[0], 0)
    for nth, x in enumerate(sets[1:], start=1):
        average_into(ours, replica(with_statistics(x, nth)), peer_weight("mean", 1.0, 1.0, nth))
    union = np.concatenate(sets)
    np.testing.assert_allclose(ours[1].running_mean.numpy(), union.mean(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours[1].running_var.numpy(), union.var(axis=0), rtol=1e-5, atol=1e-5)


def test_large_means_keep_a_precise_variance() -> None:
    """Features far from 0 (means 1000, variances about 1): E[x^2] - mean^2 in float32 would
    be off by 4 % (float32 rounds mean^2 = 1e6 to 1/16); the spread term keeps the variance precise."""
    rng = np.random.default_rng(20)
    ours_x, theirs_x = rng.normal(1000.0, 1.0, (500, CHANNELS)), rng.normal(1000.5, 1.0, (500, CHANNELS))
    ours = with_statistics(ours_x, 0)
    average_into(ours, replica(with_statistics(theirs_x, 1)), 0.5)
    np.testing.assert_allclose(ours[1].running_var.numpy(), np.concatenate([ours_x, theirs_x]).var(axis=0),
                               rtol=1e-4)


def test_adopting_a_model_copies_its_statistics_exactly() -> None:
    ours, theirs = with_statistics(data(0, 50, -2.0), 0), with_statistics(data(1, 50, 3.0), 1)
    peer = replica(theirs)
    average_into(ours, peer, 1.0)
    for name, tensor in floating_state(ours).items():
        assert torch.equal(tensor, peer[name].view_as(tensor)), name


def test_a_model_without_batchnorm_averages_bit_for_bit_as_the_plain_formula() -> None:
    """The pooling touches BatchNorm variances only: the suite's CNN and a LayerNorm/GroupNorm
    model (no running statistics) come out byte-identical to (1 - w) x + w x_peer."""
    torch.manual_seed(0)
    models = [build_model("cnn"),
              nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.GroupNorm(2, 6), nn.Linear(6, 2))]
    for model in models:
        for weight, clip in ((0.5, 1.0), (0.3, 1.0), (0.125, 0.25)):
            before = {k: v.clone() for k, v in floating_state(model).items()}
            peer = {k: torch.randn_like(v).reshape(-1) for k, v in before.items()}
            average_into(model, peer, weight, clip)
            for name, tensor in floating_state(model).items():
                expected = before[name].clone().mul_(1.0 - weight).add_(peer[name].view_as(tensor), alpha=weight)
                assert torch.equal(tensor, expected), (name, weight)


def test_statistics_kept_local_are_untouched() -> None:
    """A task that keeps BatchNorm statistics local (``Task.keep_local``: ``*.running_*``) sends
    none: they stay ours, and the weights are averaged as before."""
    ours, theirs = with_statistics(data(0, 80, -2.0), 0), with_statistics(data(1, 80, 3.0), 1)
    for model in (ours, theirs):
        setattr(model, KEEP_LOCAL, ("*.running_*",))
    peer = replica(theirs)
    assert not any("running" in k for k in peer)
    mean, var, weight = ours[1].running_mean.clone(), ours[1].running_var.clone(), ours[1].weight.clone()
    average_into(ours, peer, 0.5)
    assert torch.equal(ours[1].running_mean, mean) and torch.equal(ours[1].running_var, var)
    assert torch.allclose(ours[1].weight, 0.5 * weight + 0.5 * theirs[1].weight)


def test_only_the_means_sent_leaves_the_variance_ours() -> None:
    """A task keeping only the variances local: the means are averaged plainly, nothing pooled."""
    ours, theirs = with_statistics(data(0, 80, -2.0), 0), with_statistics(data(1, 80, 3.0), 1)
    for model in (ours, theirs):
        setattr(model, KEEP_LOCAL, ("*.running_var",))
    var = ours[1].running_var.clone()
    expected_mean = 0.5 * ours[1].running_mean + 0.5 * theirs[1].running_mean
    average_into(ours, replica(theirs), 0.5)
    assert torch.equal(ours[1].running_var, var)
    assert torch.allclose(ours[1].running_mean, expected_mean)


def test_a_clipped_far_peer_moves_our_variances_within_the_radius() -> None:
    """Robust clipping (worker/robust.py) scales the weight by s = tau / d for a peer at distance
    d: the model is averaged with the point clipped towards the peer, x + s (x_peer - x). The
    variances are pooled with that point too, so a peer whose means are huge, averaged clipped
    (a node whose every recent peer is that far clips rather than refuses: ``spread``), raises
    them by at most w (1 - w) (s d_mean)^2, inside the radius: pooled with the far peer itself at
    weight w s, they would grow with d."""
    ours = with_statistics(data(0, 200, 0.0), 0)
    hostile = replica(with_statistics(data(1, 200, 0.0), 1))
    hostile["1.running_mean"] = hostile["1.running_mean"] + 1e4
    clipper = ClipRadius()
    distance = relative_distance(ours, hostile)
    decisions = [clipper.decide("hostile", distance) for _ in range(3)]
    decision = decisions[-1]  # refused at first, then averaged clipped: the only peer is that far (spread)
    assert decisions[0].refused and decision.spread and not decision.refused and decision.scale < 1e-3
    x_norm = float(torch.sqrt(sum(torch.sum(v.float() ** 2) for v in floating_state(ours).values())))
    var_before, mean_before = ours[1].running_var.clone(), ours[1].running_mean.clone()
    clipped_mean = mean_before + decision.scale * (hostile["1.running_mean"] - mean_before)
    clipped_var = var_before + decision.scale * (hostile["1.running_var"] - var_before)
    w = 0.5
    average_into(ours, hostile, w * decision.scale, decision.scale)
    expected = (1 - w) * var_before + w * clipped_var + w * (1 - w) * (clipped_mean - mean_before) ** 2
    assert torch.allclose(ours[1].running_var, expected, rtol=1e-5, atol=1e-6)
    rise = float(torch.sum(ours[1].running_var - var_before))
    assert rise <= w * (1 - w) * (decision.radius * x_norm) ** 2 + 1e-3  # bounded by the radius
    unclipped = w * decision.scale * (1 - w * decision.scale) * float(torch.sum((hostile["1.running_mean"]
                                                                              - mean_before) ** 2))
    assert unclipped > 100 * max(rise, 1e-3)


def test_a_negative_variance_from_a_peer_is_clamped() -> None:
    """A peer's statistics are validated finite, not sensible: a variance below 0 does not make
    ours negative (BatchNorm would take the square root of it)."""
    ours = with_statistics(data(0, 50, 0.0), 0)
    peer = replica(with_statistics(data(1, 50, 0.0), 1))
    peer["1.running_var"] = torch.full((CHANNELS,), -100.0)
    average_into(ours, peer, 0.5)
    assert bool(torch.all(ours[1].running_var >= 0.0))
