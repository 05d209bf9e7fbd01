"""Compression toolbox: sparsifiers, quantizers, low-rank, memories, schedules, one interface.

Entry points: :func:`build` (spec string -> compressor), :class:`GradientPipeline` (the
gradient path), :func:`payload_bytes` (real wire size). See docs/COMPRESSION.md.
"""

from p2pnode.compression.base import (
    CompressionConfigError, Compressor, Ctx, Sparsifier, Traits, payload_bytes,
)
from p2pnode.compression.memory import DGCMemory, Memory, NoMemory, ResidualMemory, make_memory
from p2pnode.compression.pipeline import GradientPipeline
from p2pnode.compression.registry import build, build_sparsifier, names, validate
from p2pnode.compression.schedule import DelayedStart, WarmupDensity
from p2pnode.compression.packing import decode, encode

__all__ = [
    "CompressionConfigError", "Compressor", "Ctx", "Sparsifier", "Traits", "payload_bytes",
    "Memory", "NoMemory", "ResidualMemory", "DGCMemory", "make_memory", "GradientPipeline",
    "build", "build_sparsifier", "names", "validate", "DelayedStart", "WarmupDensity",
    "encode", "decode",
]
