"""Memories: what wraps a compressor across steps, with explicit state.

* ``none``: nothing carried over.
* ``residual``: error feedback (Seide et al. 2014; Stich et al. 2018; Karimireddy et al.
  2019): compress ``p = g + e`` and keep ``e <- p - sent``, so nothing is ever lost, only
  delayed: sum(sent) + e == sum(g) exactly (up to float rounding).
* ``dgc``: Deep Gradient Compression's momentum correction and momentum factor masking
  (Lin et al. 2018): ``u <- m*u + g; v <- v + u``; compress ``v``; where an element was sent,
  ``u`` and ``v`` are cleared. The momentum lives here, so the optimizer must step without
  momentum (plain SGD). Only meaningful with a sparsifier.

State is per parameter name, as dicts of tensors: ``torch.save``-able and loadable with
``weights_only=True``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from p2pnode.compression.base import CompressionConfigError

__all__ = ["Memory", "NoMemory", "ResidualMemory", "DGCMemory", "make_memory", "MEMORIES"]


class Memory(ABC):
    """compensate(name, g) -> tensor to compress; update(name, compensated, sent)."""

    name: str = "?"

    @abstractmethod
    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """The tensor to compress this step (the gradient plus what memory holds)."""

    @abstractmethod
    def update(self, name: str, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        """Record what was sent (the decompressed tensor) for ``compensated``."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class NoMemory(Memory):
    name = "none"

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        return grad

    def update(self, name: str, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        pass


class ResidualMemory(Memory):
    """Error feedback: e <- (g + e) - sent."""

    name = "residual"

    def __init__(self) -> None:
        self.residuals: dict[str, torch.Tensor] = {}

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        e = self.residuals.get(name)
        if e is None or e.shape != grad.shape:
            return grad.detach().clone()
        return grad.detach() + e

    def update(self, name: str, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        self.residuals[name] = compensated - sent

    def state_dict(self) -> dict[str, Any]:
        return {"residual": {k: v.clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residuals = {k: v.clone() for k, v in state.get("residual", {}).items()}


class DGCMemory(Memory):
    """Momentum correction + momentum factor masking (DGC, Lin et al. 2018, Sec. 3.2)."""

    name = "dgc"

    def __init__(self, momentum: float = 0.9) -> None:
        if not 0.0 <= momentum < 1.0:
            raise CompressionConfigError(f"dgc memory: momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        self.u: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        g = grad.detach()
        u = self.u.get(name)
        if u is None or u.shape != g.shape:
            u = self.u[name] = g.clone()
            v = self.v[name] = g.clone()
        else:
            u.mul_(self.momentum).add_(g)
            v = self.v[name]
            v.add_(u)
        return v.clone()

    def update(self, name: str, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        keep = sent == 0  # elements not sent keep accumulating; sent ones are cleared
        self.v[name] = compensated - sent
        self.u[name].mul_(keep)

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": self.momentum,
                "u": {k: t.clone() for k, t in self.u.items()},
                "v": {k: t.clone() for k, t in self.v.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momentum = float(state.get("momentum", self.momentum))
        self.u = {k: t.clone() for k, t in state.get("u", {}).items()}
        self.v = {k: t.clone() for k, t in state.get("v", {}).items()}


MEMORIES = ("none", "residual", "dgc")


def make_memory(kind: str, momentum: float = 0.9) -> Memory:
    if kind == "none":
        return NoMemory()
    if kind == "residual":
        return ResidualMemory()
    if kind == "dgc":
        return DGCMemory(momentum)
    raise CompressionConfigError(f"unknown memory {kind!r}; valid: {', '.join(MEMORIES)}")
