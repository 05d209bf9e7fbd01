"""Dense casts: identity, fp16 and bf16 (the "reduce model precision" family of seed 003)."""

from __future__ import annotations

import torch

from p2pnode.compression.base import Compressor, Ctx, Payload, Traits

__all__ = ["Identity", "FP16", "BF16"]


class Identity(Compressor):
    """``none``: the tensor itself (dense fp32 on the wire); the baseline for byte counts."""

    name = "none"
    traits = Traits(sparse=False, fixed_size=True, biased=False)

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        return {"x": tensor.detach().reshape(-1)}, Ctx.of(tensor, name)

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        return payload["x"].to(ctx.dtype).view(ctx.shape)


class _Cast(Compressor):
    """Round to a 16-bit float type (nearest-even: deterministic, so slightly biased)."""

    wire_dtype: torch.dtype = torch.float16
    traits = Traits(sparse=False, fixed_size=True, biased=True)

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        flat = tensor.detach().reshape(-1)
        if self.wire_dtype == torch.float16:
            # beyond fp16's range a cast gives inf; saturate instead (gradients that large are
            # already a problem, but an inf would poison every peer that averages it)
            flat = flat.clamp(-65504.0, 65504.0)
        return {"x": flat.to(self.wire_dtype)}, Ctx.of(tensor, name)

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        return payload["x"].to(ctx.dtype).view(ctx.shape)


class FP16(_Cast):
    """IEEE half: 10-bit mantissa, range +-65504 (values beyond saturate)."""

    name = "fp16"
    wire_dtype = torch.float16


class BF16(_Cast):
    """bfloat16: fp32's range, 7-bit mantissa; no overflow on gradients."""

    name = "bf16"
    wire_dtype = torch.bfloat16
