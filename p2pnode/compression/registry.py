"""Compressor name -> class, and building compressors from specs.

A spec is ``"name"`` or ``"name:key=value,key=value"``, e.g. ``"ldte-bs:density=0.01"``,
``"qsgd:levels=16"``; ``"none"`` is the identity. Parameters are the keyword arguments of the
compressor's constructor; names, parameters and their ranges are checked by the torch-free
table in :mod:`p2pnode.compression.specs` (what configuration validation uses). Every error
is a :class:`CompressionConfigError` whose message is one line naming the valid choices.
"""

from __future__ import annotations

from p2pnode.compression import specs as _specs
from p2pnode.compression.base import CompressionConfigError, Compressor, Sparsifier
from p2pnode.compression.dgc import DGCSampled
from p2pnode.compression.gaussiank import GaussianK
from p2pnode.compression.ldte import LDTEBS, LaplaceThreshold
from p2pnode.compression.powersgd import PowerSGD
from p2pnode.compression.qsgd import QSGD
from p2pnode.compression.quantize import BF16, FP16, Identity
from p2pnode.compression.randomk import RandomK
from p2pnode.compression.rgc import RGCTrimmed
from p2pnode.compression.sign import EFSignSGD, OneBit, SignSGD
from p2pnode.compression.terngrad import TernGrad
from p2pnode.compression.threshold import MeanThreshold, Strom
from p2pnode.compression.topk import TopK

__all__ = ["build", "build_sparsifier", "validate", "names", "parse", "REGISTRY"]

REGISTRY: dict[str, type[Compressor]] = {
    cls.name: cls
    for cls in (
        Identity, FP16, BF16, MeanThreshold, TopK, LDTEBS, LaplaceThreshold, DGCSampled,
        RGCTrimmed, RandomK, Strom, GaussianK, QSGD, TernGrad, SignSGD, EFSignSGD, OneBit,
        PowerSGD,
    )
}

#: the spec parser and the name list are the torch-free table's (one truth)
parse = _specs.parse
names = _specs.names


def build(spec: str) -> Compressor:
    """A fresh compressor for ``spec``; raises CompressionConfigError on any problem."""
    name, kwargs = _specs.check(spec)
    cls = REGISTRY[name]
    try:
        return cls(**kwargs)
    except CompressionConfigError as exc:
        raise CompressionConfigError(f"{spec!r}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise CompressionConfigError(f"{spec!r}: {exc}") from None


def build_sparsifier(spec: str) -> Sparsifier:
    """Like :func:`build`, but the compressor must be a sparsifier (the publish path)."""
    comp = build(spec)
    if not isinstance(comp, Sparsifier):
        raise CompressionConfigError(
            f"{spec!r}: {comp.name} is not a sparsifier; valid sparsifiers: {', '.join(_specs.sparsifiers())}"
        )
    return comp


def validate(spec: str, require_sparse: bool = False) -> None:
    """Raise CompressionConfigError if ``spec`` would not build (config checking, torch-free:
    the checks are :mod:`p2pnode.compression.specs`'s table)."""
    _specs.validate(spec, require_sparse)
