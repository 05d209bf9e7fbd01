"""DGC's sampled top-k threshold with its correction loop (Lin et al. 2018, "Deep Gradient
Compression"; the "hierarchical selection" baseline of seed 001).

As in DGC's reference code (and GRACE's port): sample ``sample`` of the elements uniformly,
take the top-k threshold of the sample, count what passes on the whole tensor, and correct
the threshold (x1.3 if too many pass, x0.7 if too few, at most 10 rounds) until the count is
within [0.7 k, 1.3 k] ... then, if more than k passed, exact top-k among those (hierarchical).
The random sample makes the count vary from call to call (the instability seed 001 avoids).
"""

from __future__ import annotations

from typing import Any

import torch

from p2pnode.compression.base import (
    CompressionConfigError, DensitySparsifier, Traits, check_density, count_true, flatnonzero,
)

__all__ = ["DGCSampled"]


class DGCSampled(DensitySparsifier):
    """Sampled threshold + correction loop + hierarchical top-k (count <= k, usually = k)."""

    name = "dgc"
    traits = Traits(sparse=True, fixed_size=False, biased=True)
    suggested_memory = "dgc"

    def __init__(self, density: float = 0.01, sample: float = 0.01, hierarchical: bool = True,
                 seed: int = 0) -> None:
        super().__init__()
        self.density = check_density(density, self.name)
        sample = float(sample)
        if not 0.0 < sample <= 1.0:
            raise CompressionConfigError(f"{self.name}: sample must be in (0, 1], got {sample!r}")
        self.sample = sample
        self.hierarchical = bool(hierarchical)
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)

    def params(self) -> dict[str, Any]:
        return {"density": self.density, "sample": self.sample,
                "hierarchical": self.hierarchical, "seed": self.seed}

    def select_k(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        n = flat.numel()
        a = self._scratch.abs(flat)
        m = max(1, min(n, int(n * self.sample)))
        if m < n:
            samples = a[torch.randint(0, n, (m,), generator=self._gen)]
        else:
            samples = a
        ks = max(1, int(round(m * k / n)))
        thr = float(torch.topk(samples, ks, sorted=False).values.min())
        mask = self._scratch.ge(a, thr)
        count = count_true(mask)
        for _ in range(10):
            if count > 1.3 * k:
                thr *= 1.3
            elif count < 0.7 * k:
                thr *= 0.7
            else:
                break
            mask = self._scratch.ge(a, thr)
            count = count_true(mask)
        idx = flatnonzero(mask)
        if self.hierarchical and idx.numel() > k:
            idx = idx[torch.topk(a.index_select(0, idx), k, sorted=False).indices]
        return idx

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            self._gen.set_state(state["rng"])
