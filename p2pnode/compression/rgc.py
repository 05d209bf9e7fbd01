"""RGC's trimmed top-k (RedSync, Fang et al. 2019; the "pruned top-k" baseline of seed 001).

Trim first, sort little: with ``mean`` and ``max`` of |x|, the threshold
``mean + r * (max - mean)`` starts at r = ``ratio`` and r halves until at least k elements
pass; exact top-k then runs on the trimmed set only. The result is exactly k elements.
"""

from __future__ import annotations

from typing import Any

import torch

from p2pnode.compression.base import (
    CompressionConfigError, DensitySparsifier, Traits, check_density, count_true, flatnonzero,
)

__all__ = ["RGCTrimmed"]


class RGCTrimmed(DensitySparsifier):
    """Trimmed top-k: exact k, at the cost of a few counting passes plus a small top-k."""

    name = "rgc"
    traits = Traits(sparse=True, fixed_size=True, biased=True)
    suggested_memory = "residual"

    def __init__(self, density: float = 0.01, ratio: float = 0.5) -> None:
        super().__init__()
        self.density = check_density(density, self.name)
        ratio = float(ratio)
        if not 0.0 < ratio < 1.0:
            raise CompressionConfigError(f"{self.name}: ratio must be in (0, 1), got {ratio!r}")
        self.ratio = ratio

    def params(self) -> dict[str, Any]:
        return {"density": self.density, "ratio": self.ratio}

    def select_k(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        a = self._scratch.abs(flat)
        mean, top = float(a.mean()), float(a.max())
        r = self.ratio
        while r > 1e-6:
            thr = mean + r * (top - mean)
            mask = self._scratch.ge(a, thr)
            if count_true(mask) >= k:
                idx = flatnonzero(mask)
                return idx[torch.topk(a.index_select(0, idx), k, sorted=False).indices]
            r *= 0.5
        # mean itself does not leave k candidates (k is a large fraction): plain top-k
        return torch.topk(a, k, sorted=False).indices
