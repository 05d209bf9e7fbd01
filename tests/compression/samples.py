"""Seeded samples the compression tests select from: Laplace (what LDTE-BS fits), Gaussian, and
Student-t with 3 degrees of freedom (a heavier tail than Laplace)."""

from __future__ import annotations

import torch


def samples(kind: str, n: int = 200_000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "laplace":
        u = torch.rand(n, generator=g) - 0.5
        return -torch.sign(u) * torch.log1p(-2 * u.abs())
    if kind == "gaussian":
        return torch.randn(n, generator=g)
    if kind == "student3":
        z = torch.randn(n, generator=g)
        chi = torch.randn(n, 3, generator=g).pow(2).sum(1)
        return z / (chi / 3).sqrt()
    raise ValueError(kind)
