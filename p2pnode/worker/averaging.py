"""Averaging a peer's model into ours (Algorithm 1, line 20, and the paper's contribution rule).

"mean" is the paper's x <- (x + x_peer) / 2. "contribution" is the paper's loss-weighted rule,
which it describes but gives no formula for; we weight each model by the other's loss,
w_peer = loss_self / (loss_self + loss_peer): equal losses give 1/2 (the mean), a peer with a
much lower loss pulls harder. The weight is clamped to [0.1, 0.9] so no single exchange wipes
out either model, and falls back to 1/2 when either loss is unknown (not finite, or -1 before the first step).

BatchNorm's running statistics are pooled, not averaged plainly: the variance taken is that of
the two nodes' data together (``pooled_spreads``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from p2pnode.pipe_protocol import mean_weight
from p2pnode.worker.batchnorm import statistics_names


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
def average_into(model: nn.Module, peer: Mapping[str, torch.Tensor], weight: float, clip: float = 1.0) -> None:
    """x <- (1 - w) x + w x_hat_peer over every floating state entry (weights and BN statistics),
    BatchNorm's running variances pooled (``pooled_spreads``).

    We average with the peer's public copy as the paper averages with its model. CHOCO-Gossip's
    consensus step x <- x + w (x_hat_peer - x_hat_self) was tried too (docs/ARCHITECTURE.md):
    with top-1 % copies it diverged at w = 1/2 and learned far slower at w = 0.1.

    ``clip``: the robust clipping's scale s already in ``weight`` (w = w_rule * s, worker/robust.py);
    it only bounds the variances' spread term (``pooled_spreads``). A model without BatchNorm
    statistics in ``peer`` is averaged exactly as the plain formula says, whatever ``clip``.
    """
    spreads = pooled_spreads(model, peer, weight, clip)
    for name, tensor in model.state_dict().items():  # a tensor at a time: a replica on disk is read so
        if tensor.is_floating_point() and name in peer:  # not frozen, nor a tied tensor's second name
            tensor.mul_(1.0 - weight).add_(peer[name].to(tensor.device).view_as(tensor), alpha=weight)
            spread = spreads.get(name)
            if spread is not None:
                tensor.add_(spread).clamp_(min=0.0)  # a peer's negative variance is no variance


def pooled_spreads(model: nn.Module, peer: Mapping[str, torch.Tensor], weight: float,
                   clip: float = 1.0) -> dict[str, torch.Tensor]:
    """What each BatchNorm running variance needs on top of its plain average to be the pooled
    variance, keyed by the variance's name (read before the means move).

    Why: a node's (mean, var) are the statistics of its own data; on label-skewed shards the
    nodes' means differ, and the variance of their data together is the mean of the second
    moments E[x^2] = var + mean^2 less the squared mean, larger than the mean of the variances by
    the spread between the means (the synchronous mode pools its finish's statistics so, with
    batchnorm.py ``variances_to_second_moments``). For two parties with weights 1 - w and w,
    (1 - w)(v + m^2) + w(v_p + m_p^2) - ((1 - w) m + w m_p)^2 = (1 - w) v + w v_p + w (1 - w)(m_p - m)^2:
    the plain average plus a non-negative term, computed so, without the cancellation of
    E[x^2] - mean^2 where the means are large. Weight 1 (adopting a model) adds 0: an exact copy.

    Clipped (``clip`` = s < 1, ``weight`` = w s): ClippedGossip averages with the point clipped
    towards the peer, x + s (x_peer - x); pooled with that point the term is w (1 - w) (s d)^2 =
    weight (s - weight) d^2, bounded by the clip radius. Pooled with the peer at weight w s
    instead, it would be w s (1 - w s) d^2, growing with a far peer's distance d, so a hostile
    mean could inflate our variances whatever the radius.

    Only layers whose mean and variance both come in ``peer``: a task that keeps them local
    (``Task.keep_local``, e.g. ``*.running_*``) sends neither, and they stay as they are."""
    coefficient = weight * (clip - weight)
    spreads: dict[str, torch.Tensor] = {}
    if coefficient <= 0.0:
        return spreads
    for mean_name, var_name in statistics_names(model):
        if mean_name not in peer or var_name not in peer:
            continue
        mean, var = model.get_buffer(mean_name), model.get_buffer(var_name)
        if not (mean.is_floating_point() and var.is_floating_point()):
            continue
        d = peer[mean_name].to(mean.device).view_as(mean).float() - mean.float()
        spreads[var_name] = (d * d).mul_(coefficient).to(var.dtype)
    return spreads


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
