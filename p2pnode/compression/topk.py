"""Exact top-k by magnitude with ``torch.topk``: the reference every estimator is measured
against (seed 001's "radixSelect" baseline is the GPU counterpart of this exact selection)."""

from __future__ import annotations

from typing import Any

import torch

from p2pnode.compression.base import DensitySparsifier, Traits, check_density

__all__ = ["TopK"]


class TopK(DensitySparsifier):
    """Keep exactly the k = round(density * n) elements of largest |x| (ties broken by torch).

    Exact but the slowest selection on large tensors (O(n log k) partial sort); biased, so use
    it with error feedback (Stich et al. 2018, "Sparsified SGD with memory").
    """

    name = "topk"
    traits = Traits(sparse=True, fixed_size=True, biased=True)
    suggested_memory = "residual"

    def __init__(self, density: float = 0.01) -> None:
        super().__init__()
        self.density = check_density(density, self.name)

    def params(self) -> dict[str, Any]:
        return {"density": self.density}

    def select_k(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        a = self._scratch.abs(flat)
        return torch.topk(a, k, sorted=False).indices
