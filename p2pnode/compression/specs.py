"""Compressor names and parameters as data: what configuration validation checks, torch-free.

The daemon validates ``compression.gradient`` and ``compression.publish`` but never compresses
(the worker does), so the check must not import torch: that cost every ``p2pnode start`` about
4 s and kept ~500 MB of libraries resident in a process that only moves bytes. This table is
the one truth for names, parameters, defaults, ranges and which compressors are sparsifiers;
:mod:`p2pnode.compression.registry` builds compressors from what :func:`check` returns, and a
test holds the table against every compressor's constructor so the two cannot drift apart.

A spec is ``"name"`` or ``"name:key=value,key=value"``; every error is a one-line
:class:`CompressionConfigError` naming the valid choices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final


class CompressionConfigError(ValueError):
    """A bad compressor spec or parameter; the message is one line for the config's author."""


#: a parameter with no default: the spec must give it
REQUIRED: Final = object()


@dataclass(frozen=True)
class Param:
    """One constructor parameter: its type, default and the range a value must fall in."""

    kind: type
    default: Any = REQUIRED
    #: (low, high, low inclusive, high inclusive); None: any finite value of the type
    bounds: tuple[float, float, bool, bool] | None = None
    #: the range in words, as the constructor's own error says it
    words: str = ""

    def check(self, who: str, key: str, value: Any) -> None:
        if self.kind is float and not math.isfinite(value):
            raise CompressionConfigError(f"{who}: {key} must be a finite number, got {value!r}")
        if self.bounds is None:
            return
        lo, hi, lo_in, hi_in = self.bounds
        ok = (value >= lo if lo_in else value > lo) and (value <= hi if hi_in else value < hi)
        if not ok:
            raise CompressionConfigError(f"{who}: {key} must be {self.words}, got {value!r}")


@dataclass(frozen=True)
class Spec:
    """A compressor as configuration sees it: its parameters and whether it sparsifies."""

    sparse: bool
    params: dict[str, Param] = field(default_factory=dict)


_INF = math.inf
_DENSITY = Param(float, 0.01, (0.0, 1.0, False, True), "in (0, 1] (fraction kept)")
_SEED = Param(int, 0)

SPECS: dict[str, Spec] = {
    "none": Spec(False),
    "fp16": Spec(False),
    "bf16": Spec(False),
    "mean-threshold": Spec(True),
    "topk": Spec(True, {"density": _DENSITY}),
    "ldte-bs": Spec(True, {"density": _DENSITY,
                           "tol": Param(float, 0.05, (0.0, 1.0, True, False), "in [0, 1)"),
                           "max_iter": Param(int, 30, (0, _INF, True, True), ">= 0")}),
    "ldte": Spec(True, {"density": _DENSITY}),
    "dgc": Spec(True, {"density": _DENSITY,
                       "sample": Param(float, 0.01, (0.0, 1.0, False, True), "in (0, 1]"),
                       "hierarchical": Param(bool, True), "seed": _SEED}),
    "rgc": Spec(True, {"density": _DENSITY,
                       "ratio": Param(float, 0.5, (0.0, 1.0, False, False), "in (0, 1)")}),
    "randomk": Spec(True, {"density": _DENSITY,
                           "seed": Param(int, 0, (0, 2**62, True, False), "in [0, 2**62)"),
                           "scale": Param(bool, True)}),
    "strom": Spec(True, {"tau": Param(float, REQUIRED, (0.0, _INF, False, False), "a positive finite number")}),
    "gaussiank": Spec(True, {"density": _DENSITY}),
    "qsgd": Spec(False, {"levels": Param(int, 16, (1, 127, True, True), "in 1..127"),
                         "bucket": Param(int, 512, (1, _INF, True, True), ">= 1"), "seed": _SEED}),
    "terngrad": Spec(False, {"clip": Param(float, 0.0, (0.0, _INF, True, False), ">= 0 (0 = off)"),
                             "seed": _SEED}),
    "signsgd": Spec(False),
    "ef-signsgd": Spec(False),
    "onebit": Spec(False),
    "powersgd": Spec(False, {"rank": Param(int, 2, (1, _INF, True, True), ">= 1"),
                             "warm_start": Param(bool, True), "seed": _SEED}),
}

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def names() -> list[str]:
    """Every accepted compressor name."""
    return list(SPECS)


def sparsifiers() -> list[str]:
    return [n for n, s in SPECS.items() if s.sparse]


def parse(spec: str) -> tuple[str, dict[str, str]]:
    """Split a spec into its name and raw ``key -> value`` strings."""
    if not isinstance(spec, str) or not spec.strip():
        raise CompressionConfigError(f"empty compressor spec; valid names: {', '.join(SPECS)}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    params: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key or not value.strip():
                raise CompressionConfigError(f"{spec!r}: parameter {item.strip()!r} is not key=value")
            if key in params:
                raise CompressionConfigError(f"{spec!r}: parameter {key!r} given twice")
            params[key] = value.strip()
    return name, params


def _convert(spec: str, key: str, raw: str, kind: type) -> Any:
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
        raise CompressionConfigError(f"{spec!r}: parameter {key}={raw!r} is not a valid {kind.__name__}") from None


def check(spec: str, require_sparse: bool = False) -> tuple[str, dict[str, Any]]:
    """The compressor's name and its converted, range-checked keyword arguments (only those
    the spec gives; the constructor's defaults fill the rest). Raises CompressionConfigError."""
    name, raw = parse(spec)
    known = SPECS.get(name)
    if known is None:
        raise CompressionConfigError(f"unknown compressor {name!r}; valid names: {', '.join(SPECS)}")
    unknown = [k for k in raw if k not in known.params]
    if unknown:
        valid = ", ".join(known.params) or "none"
        raise CompressionConfigError(f"{spec!r}: unknown parameter {unknown[0]!r} for {name}; valid parameters: {valid}")
    missing = [k for k, p in known.params.items() if p.default is REQUIRED and k not in raw]
    if missing:
        raise CompressionConfigError(f"{spec!r}: {name} needs parameter {missing[0]!r}")
    kwargs = {k: _convert(spec, k, v, known.params[k].kind) for k, v in raw.items()}
    for key, value in kwargs.items():
        known.params[key].check(f"{spec!r}: {name}", key, value)
    if require_sparse and not known.sparse:
        raise CompressionConfigError(f"{spec!r}: {name} is not a sparsifier; valid sparsifiers: {', '.join(sparsifiers())}")
    return name, kwargs


def validate(spec: str, require_sparse: bool = False) -> None:
    """Raise CompressionConfigError if ``spec`` would not build (configuration checking)."""
    check(spec, require_sparse)
