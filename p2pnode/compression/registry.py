"""Compressor names the node accepts in its config, and the spec parser.

A spec is ``"name"`` or ``"name:key=value,key=value"``, e.g. ``"ldte-bs:density=0.01"``,
``"qsgd:levels=16"``; ``"none"`` is the identity. Parameters are the keyword arguments of the
compressor's constructor, converted by their type hints (float, int, bool, str). Every error
is a :class:`CompressionConfigError` whose message is one line naming the valid choices.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

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

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def names() -> list[str]:
    """Every accepted compressor name."""
    return list(REGISTRY)


def _valid_names() -> str:
    return ", ".join(REGISTRY)


def parse(spec: str) -> tuple[str, dict[str, str]]:
    """Split a spec into its name and raw ``key -> value`` strings."""
    if not isinstance(spec, str) or not spec.strip():
        raise CompressionConfigError(f"empty compressor spec; valid names: {_valid_names()}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    params: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key or not value.strip():
                raise CompressionConfigError(
                    f"{spec!r}: parameter {item.strip()!r} is not key=value"
                )
            if key in params:
                raise CompressionConfigError(f"{spec!r}: parameter {key!r} given twice")
            params[key] = value.strip()
    return name, params


def _convert(spec: str, key: str, raw: str, kind: Any) -> Any:
    try:
        if kind is bool:
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        return str(raw)
    except ValueError:
        tname = getattr(kind, "__name__", str(kind))
        raise CompressionConfigError(f"{spec!r}: parameter {key}={raw!r} is not a valid {tname}") from None


def _signature(cls: type[Compressor]) -> dict[str, tuple[Any, Any]]:
    """Constructor parameter -> (type, default or inspect.Parameter.empty)."""
    hints = typing.get_type_hints(cls.__init__)
    out = {}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out[p.name] = (hints.get(p.name, str), p.default)
    return out


def build(spec: str) -> Compressor:
    """A fresh compressor for ``spec``; raises CompressionConfigError on any problem."""
    name, raw = parse(spec)
    cls = REGISTRY.get(name)
    if cls is None:
        raise CompressionConfigError(f"unknown compressor {name!r}; valid names: {_valid_names()}")
    sig = _signature(cls)
    unknown = [k for k in raw if k not in sig]
    if unknown:
        valid = ", ".join(sig) or "none"
        raise CompressionConfigError(
            f"{spec!r}: unknown parameter {unknown[0]!r} for {name}; valid parameters: {valid}"
        )
    missing = [k for k, (_, d) in sig.items() if d is inspect.Parameter.empty and k not in raw]
    if missing:
        raise CompressionConfigError(f"{spec!r}: {name} needs parameter {missing[0]!r}")
    kwargs = {k: _convert(spec, k, v, sig[k][0]) for k, v in raw.items()}
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
        sparse = ", ".join(n for n, c in REGISTRY.items() if issubclass(c, Sparsifier))
        raise CompressionConfigError(
            f"{spec!r}: {comp.name} is not a sparsifier; valid sparsifiers: {sparse}"
        )
    return comp


def validate(spec: str, require_sparse: bool = False) -> None:
    """Raise CompressionConfigError if ``spec`` would not build (config checking)."""
    if require_sparse:
        build_sparsifier(spec)
    else:
        build(spec)
