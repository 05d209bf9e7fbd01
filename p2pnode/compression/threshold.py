"""Fixed-rule thresholds: the paper's per-layer mean threshold and Strom's fixed threshold."""

from __future__ import annotations

import math
from typing import Any

import torch

from p2pnode.compression.base import (
    CompressionConfigError, Ctx, Payload, Sparsifier, Traits, count_true, flatnonzero,
)
from p2pnode.compression.packing import index_dtype, pack_bits, unpack_bits

__all__ = ["MeanThreshold", "Strom"]


class MeanThreshold(Sparsifier):
    """Cui 2019 (seed 000), Algorithm 1 lines 15-16: per layer, threshold = mean of the
    gradient; keep what is at or above it.

    We read "mean" as the mean *magnitude*, keeping entries with ``|g| >= mean(|g|)``: the
    signed mean of a gradient is close to 0, so ``g >= mean(g)`` would keep about half of the
    entries and drop every negative one, which biases each step towards one direction. On
    Laplace-like gradients the magnitude rule keeps about exp(-1) = 37 % of the entries, more
    on light-tailed layers; the payload size therefore varies.
    """

    name = "mean-threshold"
    traits = Traits(sparse=True, fixed_size=False, biased=True)

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        if flat.numel() == 0:
            return torch.empty(0, dtype=torch.long)
        a = self._scratch.abs(flat)
        mean = float(a.mean())
        return flatnonzero(self._scratch.ge(a, mean))

    def roundtrip(self, tensor: torch.Tensor, name: str = "") -> tuple[torch.Tensor, int]:
        """Same result as decompress(compress(x)) by a mask multiply (no index list): the
        paper's point that the mask costs next to nothing inside the optimizer step."""
        flat = tensor.detach().reshape(-1)
        if flat.numel() == 0:
            return super().roundtrip(tensor, name)
        a = self._scratch.abs(flat)
        mask = self._scratch.ge(a, float(a.mean()))
        count = count_true(mask)
        out = torch.empty_like(flat)
        torch.mul(flat, mask, out=out)  # with out=: ~8x faster than flat * mask here
        return out.view(tensor.shape), self.sparse_payload_bytes(count, flat.numel(), flat.dtype)

    def mask(self, tensor: torch.Tensor) -> torch.Tensor:
        """The boolean keep-mask of ``tensor`` (same shape): for an in-place optimizer hook."""
        a = tensor.abs()
        return a >= a.mean()


class Strom(Sparsifier):
    """Strom 2015: a fixed threshold tau; elements with |x| >= tau are sent as sign * tau
    (index + one sign bit each), everything else stays in the residual (use memory=residual).

    The threshold is a hyper-parameter, hard to tune (seed 003); kept for comparison.
    """

    name = "strom"
    traits = Traits(sparse=True, fixed_size=False, biased=True)
    suggested_memory = "residual"

    def __init__(self, tau: float) -> None:
        super().__init__()
        tau = float(tau)
        if not (tau > 0.0) or math.isinf(tau):
            raise CompressionConfigError(f"strom: tau must be a positive finite number, got {tau!r}")
        self.tau = tau

    def params(self) -> dict[str, Any]:
        return {"tau": self.tau}

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        a = self._scratch.abs(flat)
        return flatnonzero(self._scratch.ge(a, self.tau))

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        flat = tensor.detach().reshape(-1)
        idx = self.select(flat)
        signs = pack_bits(flat[idx] < 0)
        return ({"i": idx.to(index_dtype(flat.numel())), "s": signs, "tau": self.tau},
                Ctx.of(tensor, name))

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        idx = payload["i"].long()
        neg = unpack_bits(payload["s"], idx.numel())
        vals = torch.full((idx.numel(),), float(payload["tau"]), dtype=ctx.dtype)
        vals[neg] = -vals[neg]
        out = torch.zeros(ctx.numel, dtype=ctx.dtype)
        out[idx] = vals
        return out.view(ctx.shape)
