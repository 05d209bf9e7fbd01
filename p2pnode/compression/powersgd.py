"""PowerSGD (Vogels, Karimireddy, Jaggi 2019): rank-r approximation by one power iteration.

A weight of shape (out, ...) is viewed as the matrix M (out x rest), so conv kernels
(out, in, kh, kw) become (out, in*kh*kw). With Q (rest x r) from the previous step (warm start:
the power iteration then converges across steps) or random: P = orth(M Q), Q = M^T P, and the
receiver rebuilds P Q^T. The payload is P and Q, (out + rest) * r floats instead of out * rest.
Vectors (biases) and matrices too small to gain are sent dense. Biased: use memory="residual".
"""

from __future__ import annotations

from typing import Any

import torch

from p2pnode.compression.base import CompressionConfigError, Compressor, Ctx, Payload, Traits

__all__ = ["PowerSGD"]


class PowerSGD(Compressor):
    """Rank-``rank`` power-iteration compressor with per-parameter warm start."""

    name = "powersgd"
    traits = Traits(sparse=False, fixed_size=True, biased=True)
    suggested_memory = "residual"

    def __init__(self, rank: int = 2, warm_start: bool = True, seed: int = 0) -> None:
        rank = int(rank)
        if rank < 1:
            raise CompressionConfigError(f"{self.name}: rank must be >= 1, got {rank}")
        self.rank = rank
        self.warm_start = bool(warm_start)
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)
        self.q: dict[str, torch.Tensor] = {}

    def params(self) -> dict[str, Any]:
        return {"rank": self.rank, "warm_start": self.warm_start, "seed": self.seed}

    def _compressible(self, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
        if len(shape) < 2:
            return None
        rows = shape[0]
        cols = 1
        for d in shape[1:]:
            cols *= d
        r = min(self.rank, rows, cols)
        if (rows + cols) * r >= rows * cols:
            return None
        return rows, cols, r

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        ctx = Ctx.of(tensor, name)
        dims = self._compressible(ctx.shape)
        if dims is None:
            return {"x": tensor.detach().reshape(-1)}, ctx
        rows, cols, r = dims
        m = tensor.detach().reshape(rows, cols).float()
        key = name or f"shape{ctx.shape}"
        q = self.q.get(key) if self.warm_start else None
        if q is None or q.shape != (cols, r):
            q = torch.randn(cols, r, generator=self._gen)
        p = torch.linalg.qr(m @ q).Q  # orthonormal columns (rows x r)
        q = m.T @ p
        if self.warm_start:
            self.q[key] = q
        return {"p": p, "q": q}, ctx

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        if "x" in payload:
            return payload["x"].to(ctx.dtype).view(ctx.shape)
        return (payload["p"].float() @ payload["q"].float().T).to(ctx.dtype).view(ctx.shape)

    def state_dict(self) -> dict[str, Any]:
        return {"q": {k: v.clone() for k, v in self.q.items()}, "rng": self._gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q = {k: v.clone() for k, v in state.get("q", {}).items()}
        if "rng" in state:
            self._gen.set_state(state["rng"])
