"""One bit per element: signSGD, EF-SignSGD and Seide's 1-bit SGD. Signs go 8 to a byte.

* ``signsgd`` (Bernstein et al. 2018): sign(x) as +-1; the learning rate sets the step.
* ``ef-signsgd`` (Karimireddy et al. 2019): (||x||_1 / n) * sign(x), meant to run with error
  feedback (memory="residual"): the scaled sign is the compressor, the residual the memory.
* ``onebit`` (Seide et al. 2014): per row of the tensor viewed as (shape[0], -1), negatives
  are sent as the mean of that row's negatives and the rest as the mean of its non-negatives
  (the reconstruction that minimises the squared error for a 0 threshold); with error feedback.
"""

from __future__ import annotations

import torch

from p2pnode.compression.base import Compressor, Ctx, Payload, Traits
from p2pnode.compression.packing import pack_bits, unpack_bits

__all__ = ["SignSGD", "EFSignSGD", "OneBit"]


def _signs(payload: Payload, n: int) -> torch.Tensor:
    """+1 / -1 float tensor from the packed 'negative' bits."""
    neg = unpack_bits(payload["s"], n)
    return 1.0 - 2.0 * neg.to(torch.float32)


class SignSGD(Compressor):
    """sign(x), zeros sent as +1: 1 bit per element."""

    name = "signsgd"
    traits = Traits(sparse=False, fixed_size=True, biased=True)

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        return {"s": pack_bits(tensor.detach().reshape(-1) < 0)}, Ctx.of(tensor, name)

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        return _signs(payload, ctx.numel).to(ctx.dtype).view(ctx.shape)


class EFSignSGD(Compressor):
    """Scaled sign (||x||_1 / n) * sign(x); use memory="residual" (error feedback)."""

    name = "ef-signsgd"
    traits = Traits(sparse=False, fixed_size=True, biased=True)
    suggested_memory = "residual"

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        flat = tensor.detach().reshape(-1)
        scale = float(flat.abs().mean()) if flat.numel() else 0.0
        return {"s": pack_bits(flat < 0), "m": scale}, Ctx.of(tensor, name)

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        return (_signs(payload, ctx.numel) * float(payload["m"])).to(ctx.dtype).view(ctx.shape)


class OneBit(Compressor):
    """1-bit SGD: sign bit + per-row means of the negative and non-negative parts."""

    name = "onebit"
    traits = Traits(sparse=False, fixed_size=True, biased=True)
    suggested_memory = "residual"

    @staticmethod
    def _rows(shape: tuple[int, ...]) -> int:
        return shape[0] if len(shape) >= 2 and shape[0] > 0 else 1

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        ctx = Ctx.of(tensor, name)
        m = tensor.detach().reshape(self._rows(ctx.shape), -1).float()
        neg = m < 0
        nneg = neg.sum(dim=1)
        npos = m.shape[1] - nneg
        sneg = torch.where(neg, m, 0.0).sum(dim=1)
        spos = m.sum(dim=1) - sneg
        mean_neg = sneg / nneg.clamp(min=1)
        mean_pos = spos / npos.clamp(min=1)
        return {"s": pack_bits(neg), "p": mean_pos, "q": mean_neg}, ctx

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        rows = self._rows(ctx.shape)
        neg = unpack_bits(payload["s"], ctx.numel).view(rows, -1)
        out = torch.where(neg, payload["q"].float()[:, None], payload["p"].float()[:, None])
        return out.to(ctx.dtype).view(ctx.shape)
