"""Averaging a peer's model into ours (Algorithm 1, line 20, and the paper's contribution rule).

"mean" is the paper's x <- (x + x_peer) / 2. "contribution" is the paper's loss-weighted rule,
which it describes but gives no formula for; we weight each model by the other's loss,
w_peer = loss_self / (loss_self + loss_peer): equal losses give 1/2 (the mean), a peer with a
much lower loss pulls harder. The weight is clamped to [0.1, 0.9] so no single exchange wipes
out either model, and falls back to 1/2 when either loss is unknown (not finite, or -1 before the first step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from p2pnode.pipe_protocol import mean_weight


def peer_weight(rule: str, own_loss: float, peer_loss: float, nth: int = 1) -> float:
    """``nth``: the payload's place in its round (exchange.peers_per_round): under "mean" the
    n-th is weighted 1/(n+1), so k payloads of one round leave the plain mean of k+1 models."""
    if rule == "mean":
        return mean_weight(nth)
    if rule != "contribution":
        raise ValueError(f"unknown averaging rule {rule!r}")
    if not (math.isfinite(own_loss) and math.isfinite(peer_loss)) or own_loss <= 0 or peer_loss <= 0:
        return 0.5
    return min(0.9, max(0.1, own_loss / (own_loss + peer_loss)))


@torch.no_grad()
def average_into(model: nn.Module, peer: Mapping[str, torch.Tensor], weight: float) -> None:
    """x <- (1 - w) x + w x_hat_peer over every floating state entry (weights and BN statistics).

    We average with the peer's public copy as the paper averages with its model. CHOCO-Gossip's
    consensus step x <- x + w (x_hat_peer - x_hat_self) was tried too (docs/ARCHITECTURE.md):
    with top-1 % copies it diverged at w = 1/2 and learned far slower at w = 0.1.
    """
    for name, tensor in model.state_dict().items():  # a tensor at a time: a replica on disk is read so
        if tensor.is_floating_point() and name in peer:  # not frozen, nor a tied tensor's second name
            tensor.mul_(1.0 - weight).add_(peer[name].to(tensor.device).view_as(tensor), alpha=weight)


@torch.no_grad()
def relative_distance(model: nn.Module, peer: Mapping[str, torch.Tensor]) -> float:
    """||x - x_hat_peer|| / ||x|| over the floating state: how far apart two nodes' models are
    (the consensus finish runs until this is small for every peer)."""
    diff, norm = 0.0, 0.0
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and name in peer:
            x = tensor.reshape(-1).float()
            diff += float(torch.sum((x - peer[name].reshape(-1).to(x.device, torch.float32)) ** 2))
            norm += float(torch.sum(x * x))
    return math.sqrt(diff) / max(math.sqrt(norm), 1e-12)
