"""Gaussian-k (Shi et al. 2019, "Understanding top-k sparsification in distributed deep
learning"): threshold from a Gaussian fit of the gradient, then a short correction loop.

``t = mu + sigma * Phi^-1(1 - density / 2)`` on |x - mu|; then, as in the authors' code, at most
3 rounds of ``t *= 0.5`` if fewer than 2k/3 pass or ``t *= 1.5`` if more than 4k/3 pass.
Gradients are heavier-tailed than Gaussian, so the first guess keeps too many.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

import torch

from p2pnode.compression.base import (
    DensitySparsifier, Traits, check_density, count_true, flatnonzero,
)

__all__ = ["GaussianK"]


class GaussianK(DensitySparsifier):
    """Gaussian-fit threshold with a 3-round correction (count within [2k/3, 4k/3] mostly)."""

    name = "gaussiank"
    traits = Traits(sparse=True, fixed_size=False, biased=True)
    suggested_memory = "residual"

    def __init__(self, density: float = 0.01) -> None:
        super().__init__()
        self.density = check_density(density, self.name)

    def params(self) -> dict[str, Any]:
        return {"density": self.density}

    def select_k(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        n = flat.numel()
        mu = float(flat.mean())
        a = self._scratch.abs(flat)
        if mu != 0.0:  # |x - mu| into the same scratch buffer, no temporary
            torch.sub(flat, mu, out=a).abs_()
        std = float(torch.linalg.vector_norm(a)) / max(1, n - 1) ** 0.5
        thr = std * NormalDist().inv_cdf(1.0 - 0.5 * k / n)
        mask = self._scratch.ge(a, thr)
        for _ in range(3):
            count = count_true(mask)
            if count < 2 * k / 3:
                thr *= 0.5
            elif count > 4 * k / 3:
                thr *= 1.5
            else:
                break
            mask = self._scratch.ge(a, thr)
        return flatnonzero(mask)
