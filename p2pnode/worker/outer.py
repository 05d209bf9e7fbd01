"""DiLoCo's outer step over gossip (``training.outer = "nesterov"``).

DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models"; OpenDiLoCo, Jaghouar et al. 2024) trains H local steps, then treats the round's
displacement x_round_start - x_local as a *pseudo-gradient*: all workers average it and apply an
outer Nesterov step (lr 0.7, momentum 0.9 in the paper). With H in the hundreds the bytes fall by
two orders of magnitude against averaging every few steps.

Over gossip there is no all-reduce: the average is the one p2pnode already takes, with one peer's
public copy, x <- (1 - w) x + w x_hat_peer, and the outer step then runs on what that average
gives, from the round's start (the *anchor*):

    delta  = anchor - x_mixed                          (the round's pseudo-gradient, network-mixed)
    v      = mu v + delta
    x      = anchor - lr_outer (delta + mu v)          (Nesterov)
    anchor = x

H is the exchange period: ``exchange.every = compression.publish_every = H``, so a node publishes
its local model once a round and averages with a peer once a round. After training ends (the
consensus finish) averages are plain: there is no local progress to extrapolate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class OuterNesterov:
    """Anchor and outer momentum of one node, over the floating parameters (buffers such as
    BatchNorm statistics are averaged, not extrapolated)."""

    def __init__(self, model: nn.Module, lr: float, momentum: float) -> None:
        if lr <= 0 or not 0 <= momentum < 1:
            raise ValueError(f"outer step needs lr > 0 and momentum in [0, 1), got {lr}, {momentum}")
        self.lr = lr
        self.momentum = momentum
        self.anchor = {name: p.detach().clone() for name, p in model.named_parameters()}
        self.velocity = {name: torch.zeros_like(p) for name, p in model.named_parameters()}

    @torch.no_grad()
    def step(self, model: nn.Module) -> float:
        """Take the outer step on the model just averaged; returns ||delta|| (for status)."""
        sq = 0.0
        for name, p in model.named_parameters():
            anchor, v = self.anchor[name], self.velocity[name]
            delta = anchor - p
            sq += float((delta.float() ** 2).sum())
            v.mul_(self.momentum).add_(delta)
            anchor.sub_(delta.add(v, alpha=self.momentum), alpha=self.lr)
            p.copy_(anchor)
        return sq ** 0.5

    @torch.no_grad()
    def restart(self, model: nn.Module) -> None:
        """The model was replaced (adopted from a peer, restored after a divergence): the next
        round starts from it, with no momentum carried over from a model that is gone."""
        for name, p in model.named_parameters():
            self.anchor[name].copy_(p)
            self.velocity[name].zero_()

    def state_dict(self) -> dict[str, Any]:
        return {"anchor": {k: v.clone() for k, v in self.anchor.items()},
                "velocity": {k: v.clone() for k, v in self.velocity.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, mine in (("anchor", self.anchor), ("velocity", self.velocity)):
            saved = state[key]
            if set(saved) != set(mine) or any(saved[k].shape != mine[k].shape for k in mine):
                raise ValueError(f"outer step state ({key}) does not fit this model")
            for k, v in saved.items():
                mine[k].copy_(v)
