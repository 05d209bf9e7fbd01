"""The one interface every compressor implements.

A compressor is a pure operator: ``compress(tensor) -> (payload, ctx)`` and
``decompress(payload, ctx) -> tensor`` of the same shape and dtype. The *payload* is what
travels (a small tree of numbers, strings and arrays, encoded by :mod:`.packing`); the *context*
is local metadata the receiver can rebuild from its own copy of the model (shape and dtype),
so a peer decompresses with ``Ctx(shape, dtype)`` and the payload alone. State that outlives
one call (PowerSGD's warm start) is explicit, via ``state_dict`` / ``load_state_dict``.

Error feedback and DGC momentum live in :mod:`.memory`, schedules in :mod:`.schedule`: the same
compressor serves the gradient path and the publish path (see docs/COMPRESSION.md).

Ratios: *density* is always the fraction of elements kept (0.01 = keep 1 %).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from p2pnode.compression.specs import CompressionConfigError
from p2pnode.compression.packing import ArraySpec, index_dtype, payload_bytes

__all__ = [
    "Traits", "Ctx", "Compressor", "Sparsifier", "CompressionConfigError", "payload_bytes",
    "Payload", "kept_count", "check_density", "Scratch",
]

Payload = dict[str, Any]


@dataclass(frozen=True)
class Traits:
    """What a compressor is, so callers can choose without knowing the method.

    sparse: the decompressed tensor is zero outside a selected index set (a sparsifier).
    fixed_size: the payload size depends only on the tensor's shape, not on its values.
    biased: E[decompress(compress(x))] != x (needs error feedback to converge well).
    """

    sparse: bool
    fixed_size: bool
    biased: bool


@dataclass(frozen=True)
class Ctx:
    """Local context of one compressed tensor: enough, with the payload, to rebuild it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    name: str = ""

    @classmethod
    def of(cls, tensor: torch.Tensor, name: str = "") -> Ctx:
        return cls(tuple(tensor.shape), tensor.dtype, name)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def check_density(density: float, who: str) -> float:
    """Validate a density (fraction kept) in (0, 1]."""
    try:
        d = float(density)
    except (TypeError, ValueError):
        raise CompressionConfigError(f"{who}: density must be a number in (0, 1], got {density!r}") from None
    if not (0.0 < d <= 1.0) or math.isnan(d):
        raise CompressionConfigError(f"{who}: density must be in (0, 1] (fraction kept), got {density!r}")
    return d


def kept_count(numel: int, density: float) -> int:
    """k = round(density * numel), at least 1 and at most numel."""
    return max(1, min(numel, int(round(density * numel))))


class Compressor(ABC):
    """tensor -> (payload, ctx) -> tensor. Subclasses set ``name`` and ``traits``."""

    name: ClassVar[str] = "?"
    traits: Traits = Traits(sparse=False, fixed_size=True, biased=True)
    #: memory the method is meant to run with ("none", "residual"); advisory, see pipeline
    suggested_memory: ClassVar[str] = "none"

    @abstractmethod
    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        """Encode ``tensor``; ``name`` identifies the parameter for stateful methods."""

    @abstractmethod
    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        """Rebuild a tensor of ``ctx.shape`` and ``ctx.dtype``."""

    def roundtrip(self, tensor: torch.Tensor, name: str = "") -> tuple[torch.Tensor, int]:
        """decompress(compress(tensor)) and the payload's real wire size in bytes."""
        payload, ctx = self.compress(tensor, name)
        return self.decompress(payload, ctx), payload_bytes(payload)

    def params(self) -> dict[str, Any]:
        """Constructor parameters, for :attr:`spec` (overridden where there are any)."""
        return {}

    @property
    def spec(self) -> str:
        """Canonical spec string that :func:`p2pnode.compression.registry.build` accepts."""
        p = self.params()
        if not p:
            return self.name
        return self.name + ":" + ",".join(f"{k}={_fmt(v)}" for k, v in p.items())

    def state_dict(self) -> dict[str, Any]:
        """Persistent state (tensors, numbers, strings, lists, dicts only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class Scratch:
    """Reusable work buffers for one sparsifier.

    Allocating a fresh 100 MB ``|x|`` for a 25 M tensor costs ~40 ms on this machine (page
    faults), writing into a kept buffer ~5 ms. Buffers grow to the largest tensor seen; a
    sparsifier instance is therefore not thread-safe (the training worker is one thread).
    """

    def __init__(self) -> None:
        self._abs: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None

    def abs(self, flat: torch.Tensor) -> torch.Tensor:
        n = flat.numel()
        buf = self._abs
        if buf is None or buf.numel() < n or buf.dtype != flat.dtype:
            buf = self._abs = torch.empty(n, dtype=flat.dtype)
        out = buf[:n]
        torch.abs(flat, out=out)
        return out

    def ge(self, a: torch.Tensor, threshold: float) -> torch.Tensor:
        n = a.numel()
        buf = self._mask
        if buf is None or buf.numel() < n:
            buf = self._mask = torch.empty(n, dtype=torch.bool)
        out = buf[:n]
        torch.ge(a, threshold, out=out)
        return out

    def release(self) -> None:
        self._abs = self._mask = None


def count_true(mask: torch.Tensor) -> int:
    """Number of True in a 1-D bool tensor (numpy's count is ~4x faster than torch's here)."""
    import numpy as np

    return int(np.count_nonzero(mask.numpy()))


def flatnonzero(mask: torch.Tensor) -> torch.Tensor:
    """Indices of True in a 1-D bool tensor; numpy's version is ~3x faster than torch's here."""
    import numpy as np

    return torch.from_numpy(np.flatnonzero(mask.numpy()))


class Sparsifier(Compressor):
    """A compressor that keeps a subset of elements: payload = indices + their values.

    Subclasses implement :meth:`select`. Indices travel in the narrowest integer type that
    holds them (int16 for tensors up to 32 768 elements, else int32), values in the input dtype.
    """

    traits = Traits(sparse=True, fixed_size=False, biased=True)

    def __init__(self) -> None:
        self._scratch = Scratch()

    @abstractmethod
    def select(self, flat: torch.Tensor) -> torch.Tensor:
        """Indices (int64) into the 1-D float tensor ``flat`` of the elements to keep."""

    def compress(self, tensor: torch.Tensor, name: str = "") -> tuple[Payload, Ctx]:
        flat = tensor.detach().reshape(-1)
        idx = self.select(flat)
        return {"i": idx.to(index_dtype(flat.numel())), "v": flat[idx]}, Ctx.of(tensor, name)

    def decompress(self, payload: Payload, ctx: Ctx) -> torch.Tensor:
        out = torch.zeros(ctx.numel, dtype=ctx.dtype)
        out[payload["i"].long()] = payload["v"].to(ctx.dtype)
        return out.view(ctx.shape)

    @staticmethod
    def sparse_payload_bytes(count: int, numel: int, dtype: torch.dtype) -> int:
        """Exact :func:`payload_bytes` of the index + value payload for ``count`` elements."""
        return payload_bytes({"i": ArraySpec(index_dtype(numel), (count,)),
                              "v": ArraySpec(dtype, (count,))})


class DensitySparsifier(Sparsifier):
    """A sparsifier aiming at a kept fraction ``self.density``: ``select`` works out k (and
    keeps everything when k reaches n); subclasses only say how to find k elements."""

    density: float

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        n = flat.numel()
        k = kept_count(n, self.density)
        if k >= n:
            return torch.arange(n)
        return self.select_k(flat, k)

    @abstractmethod
    def select_k(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        """Indices (int64) of about ``k`` elements of ``flat`` to keep (0 < k < n)."""
