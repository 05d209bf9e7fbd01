"""Compression toolbox: sparsifiers, quantizers, low-rank, memories, schedules, one interface.

Entry points: :func:`build` (spec string -> compressor), :class:`GradientPipeline` (the
gradient path), :func:`payload_bytes` (real wire size). See docs/COMPRESSION.md.

The exports are loaded on first use (PEP 562): importing :mod:`p2pnode.compression.specs`
(configuration validation, in the daemon) must not pull in torch through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from p2pnode.compression.base import (
        CompressionConfigError, Compressor, Ctx, Sparsifier, Traits, payload_bytes,
    )
    from p2pnode.compression.memory import DGCMemory, Memory, NoMemory, ResidualMemory, make_memory
    from p2pnode.compression.packing import decode, encode
    from p2pnode.compression.pipeline import GradientPipeline
    from p2pnode.compression.registry import build, build_sparsifier, names, validate
    from p2pnode.compression.schedule import DelayedStart, WarmupDensity

_WHERE = {
    "CompressionConfigError": "specs", "Compressor": "base", "Ctx": "base", "Sparsifier": "base",
    "Traits": "base", "payload_bytes": "base", "Memory": "memory", "NoMemory": "memory",
    "ResidualMemory": "memory", "DGCMemory": "memory", "make_memory": "memory",
    "GradientPipeline": "pipeline", "build": "registry", "build_sparsifier": "registry",
    "names": "registry", "validate": "registry", "DelayedStart": "schedule",
    "WarmupDensity": "schedule", "encode": "packing", "decode": "packing",
}

__all__ = [
    "CompressionConfigError", "Compressor", "Ctx", "Sparsifier", "Traits", "payload_bytes",
    "Memory", "NoMemory", "ResidualMemory", "DGCMemory", "make_memory", "GradientPipeline",
    "build", "build_sparsifier", "names", "validate", "DelayedStart", "WarmupDensity",
    "encode", "decode",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
