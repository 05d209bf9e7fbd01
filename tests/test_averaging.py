"""The averaging rules of worker/averaging.py: the paper's mean and its contribution rule."""

from __future__ import annotations

import math

import pytest
import torch

from p2pnode.models import build_model
from p2pnode.worker.averaging import average_into, peer_weight
from p2pnode.worker.public import floating_state


def test_mean_is_one_half_whatever_the_losses() -> None:
    assert peer_weight("mean", 2.0, 0.1) == 0.5


def test_a_round_of_several_peers_ends_at_the_plain_mean() -> None:
    """exchange.peers_per_round = 3: the n-th payload of a round weighs 1/(n+1), so our model and
    the three peers' each count a quarter, whichever lands first (not 1/8, 1/8, 1/4, 1/2)."""
    torch.manual_seed(0)
    model = build_model("cnn")
    ours = {k: v.clone() for k, v in floating_state(model).items()}
    peers = [{k: torch.randn_like(v) for k, v in ours.items()} for _ in range(3)]
    for nth, peer in enumerate(peers, start=1):
        average_into(model, peer, peer_weight("mean", 1.0, 1.0, nth))
    for name, tensor in floating_state(model).items():
        mean = (ours[name] + sum(p[name] for p in peers)) / 4
        assert torch.allclose(tensor, mean, atol=1e-6), name


@pytest.mark.parametrize("own, peer, expected", [
    (1.0, 1.0, 0.5),      # equal losses: the mean
    (3.0, 1.0, 0.75),     # the peer is better: it pulls harder
    (1.0, 3.0, 0.25),
    (100.0, 0.01, 0.9),   # clamped: no single exchange replaces our model
    (0.01, 100.0, 0.1),
    (float("nan"), 1.0, 0.5),  # unknown losses: the mean
    (1.0, -1.0, 0.5),     # -1: the peer has not trained yet
])
def test_contribution_weights_by_the_other_loss(own: float, peer: float, expected: float) -> None:
    assert math.isclose(peer_weight("contribution", own, peer), expected)


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError):
        peer_weight("median", 1.0, 1.0)


def test_average_into_moves_every_floating_entry_by_the_weight() -> None:
    torch.manual_seed(0)
    model = build_model("cnn")
    before = {k: v.clone() for k, v in floating_state(model).items()}
    peer = {k: torch.randn_like(v).reshape(-1) for k, v in before.items()}  # replicas are flat
    average_into(model, peer, 0.25)
    for name, tensor in floating_state(model).items():
        expected = 0.75 * before[name] + 0.25 * peer[name].view_as(tensor)
        assert torch.allclose(tensor, expected, atol=1e-6), name
    average_into(model, peer, 1.0)  # adopting a peer's model copies it exactly
    for name, tensor in floating_state(model).items():
        assert torch.equal(tensor, peer[name].view_as(tensor)), name
