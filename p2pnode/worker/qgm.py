"""Quasi-global momentum (Lin, Karimireddy, Stich, Jaggi 2021, "Quasi-Global Momentum:
Accelerating Decentralized Deep Learning on Heterogeneous Data", Algorithm 1, QG-DSGDm).

With local momentum each node's buffer is built from its own gradients only. On label-skewed
shards it keeps pushing the model towards the node's own classes for ~1/(1-beta) steps after
every average, and that drift is what averaging with a peer then has to undo. QG-DSGDm builds
the buffer instead from how the model *actually* moved between two steps — the local update
plus whatever averaging with peers did in between — so the buffer estimates the network's
direction, not the node's:

    d_t       = g_t + beta * m_t                       (heavy ball with the quasi-global buffer)
    x_{t+1/2} = x_t - lr_t * d_t
    x_{t+1}   = x_{t+1/2} after any averaging with peers (the worker does this between steps)
    m_{t+1}   = mu * m_t + (1 - mu) * (x_t - x_{t+1}) / lr_t

The displacement is measured at the start of the next step, so averaging that happens at any
time between two steps (the worker takes peer payloads between steps) is counted. mu = beta.
No extra bytes: nothing but the model crosses the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


class QuasiGlobalSGD(torch.optim.Optimizer):
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, beta, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "buf" not in state:
                    state["buf"] = torch.zeros_like(p)
                    state["anchor"] = p.detach().clone()
                    state["prev_lr"] = 0.0
                buf, anchor = state["buf"], state["anchor"]
                if state["prev_lr"] > 0.0:
                    # how far the model moved since the last step began: that step plus averaging
                    buf.mul_(beta).add_(anchor.sub_(p), alpha=(1.0 - beta) / state["prev_lr"])
                anchor.copy_(p)
                d = p.grad if wd == 0 else p.grad.add(p, alpha=wd)
                p.add_(d.add(buf, alpha=beta), alpha=-lr)
                state["prev_lr"] = float(lr)
        return loss
