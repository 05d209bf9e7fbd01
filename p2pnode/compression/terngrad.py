"""TernGrad (Wen et al. 2017): per-layer scale s = max|g|, values in {-s, 0, +s}.

``t_i = s * sign(g_i) * b_i`` with ``b_i ~ Bernoulli(|g_i| / s)``: unbiased. Optional gradient
clipping at ``clip`` standard deviations (the paper uses 2.5) narrows the scale and lowers the
variance but makes the estimate biased. Codes t+1 in {0, 1, 2} travel 4 to a byte.
"""

from __future__ import annotations

from typing import Any

import torch

from p2pnode.compression.base import CompressionConfigError, Compressor, Ctx, Payload, Traits
from p2pnode.compression.packing import pack_uint, unpack_uint

__all__ = ["TernGrad"]


class TernGrad(Compressor):
    """Stochastic ternarisation, 2 bits per element plus one float scale."""

    name = "terngrad"
    traits = Traits(sparse=False, fixed_size=True, biased=False)

    def __init__(self, clip: float = 0.0, seed: int = 0) -> None:
        clip = float(clip)
        if clip < 0.0:
            raise CompressionConfigError(f"{self.name}: clip must be >= 0 (0 = off), got {clip}")
        self.clip = clip
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)
        if clip > 0.0:
            self.traits = Traits(sparse=False, fixed_size=True, biased=True)

    def params(self) -> dict[str, Any]:
        return {"clip": self.clip, "seed": self.seed}

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        g = tensor.detach().reshape(-1).float()
        if self.clip > 0.0 and g.numel() > 1:
            c = self.clip * float(g.std())
            g = g.clamp(-c, c)
        a = g.abs()
        s = float(a.max()) if g.numel() else 0.0
        if s > 0.0:
            b = torch.rand(g.shape, generator=self._gen) < a / s
        else:
            b = torch.zeros(g.shape, dtype=torch.bool)
        t = torch.where(g < 0, -1, 1).to(torch.int8) * b
        return {"s": s, "c": pack_uint((t + 1).to(torch.uint8), 2)}, Ctx.of(tensor, name)

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        t = unpack_uint(payload["c"], 2, ctx.numel).to(torch.float32) - 1.0
        return (t * float(payload["s"])).to(ctx.dtype).view(ctx.shape)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            self._gen.set_state(state["rng"])
