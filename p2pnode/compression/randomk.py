"""Random-k with a shared seed (Stich et al. 2018; Wangni et al. 2018).

Indices are drawn from a seed, so only the seed and the k values travel: the receiver draws
the same indices. Values are scaled by n / k, which makes the estimate unbiased:
E[decompress(compress(x))] = x.
"""

from __future__ import annotations

from typing import Any

import torch

from p2pnode.compression.base import (
    CompressionConfigError, Ctx, Payload, Sparsifier, Traits, check_density, kept_count,
)

__all__ = ["RandomK"]


def _indices(seed: int, n: int, k: int) -> torch.Tensor:
    """k distinct indices of [0, n) from ``seed``: same on every machine (CPU generator)."""
    g = torch.Generator().manual_seed(seed)
    if k * 4 >= n:
        return torch.randperm(n, generator=g)[:k]
    # sparse draw: sample with replacement and top up until k distinct (cheap when k << n)
    idx = torch.unique(torch.randint(0, n, (k + k // 8 + 16,), generator=g))
    while idx.numel() < k:
        more = torch.randint(0, n, (k,), generator=g)
        idx = torch.unique(torch.cat([idx, more]))
    perm = torch.randperm(idx.numel(), generator=g)[:k]
    return idx[perm]


class RandomK(Sparsifier):
    """k uniformly random elements, values scaled by n/k (``scale=false``: unscaled, biased)."""

    name = "randomk"
    traits = Traits(sparse=True, fixed_size=True, biased=False)

    def __init__(self, density: float = 0.01, seed: int = 0, scale: bool = True) -> None:
        super().__init__()
        self.density = check_density(density, self.name)
        if not 0 <= int(seed) < 2**62:
            raise CompressionConfigError(f"{self.name}: seed must be in [0, 2**62), got {seed!r}")
        self.seed = int(seed)
        self.scale = bool(scale)
        self.calls = 0  # a fresh seed per call, derived from (seed, calls)
        if not self.scale:
            self.traits = Traits(sparse=True, fixed_size=True, biased=True)

    def params(self) -> dict[str, Any]:
        return {"density": self.density, "seed": self.seed, "scale": self.scale}

    def _next_seed(self) -> int:
        self.calls += 1
        return (self.seed * 1_000_003 + self.calls * 7919) % (2**62)

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        n = flat.numel()
        return _indices(self._next_seed(), n, kept_count(n, self.density))

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        flat = tensor.detach().reshape(-1)
        n = flat.numel()
        k = kept_count(n, self.density)
        seed = self._next_seed()
        vals = flat[_indices(seed, n, k)]
        if self.scale:
            vals = vals * (n / k)
        return {"seed": seed, "k": k, "v": vals}, Ctx.of(tensor, name)

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        idx = _indices(int(payload["seed"]), ctx.numel, int(payload["k"]))
        out = torch.zeros(ctx.numel, dtype=ctx.dtype)
        out[idx] = payload["v"].to(ctx.dtype)
        return out.view(ctx.shape)

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = int(state.get("calls", 0))
