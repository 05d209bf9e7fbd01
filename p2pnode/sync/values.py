"""How the synchronous mode's values cross the wire (``exchange.sync_values``), both ways: a
node's contribution to a phase and the reducer's mean of them. Torch-free (numpy): the reducer
runs in the daemon.

- ``float16``: two bytes a value.
- ``int8``: one byte a value, in blocks of ``BLOCK`` values, each block scaled by its largest
  magnitude (one float32 scale a block, so 1/16 more bytes). Twice the values for the bytes: the
  rank of PowerSGD's approximation can double at the same cost, and on even shards the rank is
  what the synchronous mode's gap to DDP is made of (docs/ALGORITHMS.md, "Synchronous
  PowerSGD"). Blocks rather than one scale a tensor because a factor's columns differ by orders
  of magnitude (the first singular direction carries the most): the worker sends each factor
  column by column, each column padded to whole blocks (``sync/worker_powersgd.py``), so a block lies
  within one column.
- ``int4``: half a byte a value, in the same blocks (values -7..7 a scale), two a byte: twice
  int8's values again for the bytes, so twice the rank again.
- ``float32``: the models after training (the final mean is not rounded).

An int8 value is ``<u4`` count, the blocks' ``<f4`` scales, then the ``i1`` values; int4 the
same head, then the values plus 8 two to a byte (the first in the low four bits; an odd count's
last byte has 0 in its high bits).
"""

from __future__ import annotations

import math

import numpy as np

#: the kinds sent in blocks of BLOCK values with a float32 scale each, and their largest level
LEVELS = {"int8": 127, "int4": 7}
KINDS = ("float16", *LEVELS)
#: values a scale covers in int8 and int4
BLOCK = 64
#: the largest float16: larger values are clipped to it rather than sent as infinities
F16_MAX = 65504.0
_HEAD = 4


def resolve(values: str, adaptive: bool) -> str:
    """``exchange.sync_values`` as it crosses: "auto" is int8 for a task whose optimizer adapts
    each coordinate's step (AdamW...: a byte LM ended 0.78 perplexity over its all-reduce
    reference in int4 and 0.24 in int8 at the same rank, as near as every tensor whole in
    float16; docs/ALGORITHMS.md), int4 otherwise (half the bytes at rank 24)."""
    if values != "auto":
        return values
    return "int8" if adaptive else "int4"


class BadValues(ValueError):
    """Bytes that are not a phase's values (bad length, non-finite, malformed)."""


def encode(flat: np.ndarray, kind: str) -> bytes:
    """``flat`` (a float array: the reducer's float64 mean is rounded once, straight to
    ``kind``) as ``kind`` bytes."""
    flat = np.asarray(flat).reshape(-1)
    if kind == "float32":
        return flat.astype("<f4").tobytes()
    if kind == "float16":
        return np.clip(flat, -F16_MAX, F16_MAX).astype("<f2").tobytes()
    if kind not in LEVELS:
        raise ValueError(f"unknown value kind {kind!r}")
    levels = LEVELS[kind]
    n = flat.size
    blocks = math.ceil(n / BLOCK)
    padded = np.zeros(blocks * BLOCK, dtype=np.float64)
    padded[:n] = flat
    rows = padded.reshape(blocks, BLOCK)
    scale = (np.abs(rows).max(axis=1) / levels).astype(np.float32)  # as it crosses: the values divide by it
    safe = np.where(scale > 0, scale, 1.0)[:, None]
    q = np.clip(np.rint(rows / safe), -levels, levels).astype("i1").reshape(-1)[:n]
    return np.uint32(n).astype("<u4").tobytes() + scale.astype("<f4").tobytes() + _pack(q, kind)


def _body_size(n: int, kind: str) -> int:
    """Bytes of ``n`` values of ``kind`` after the head: int4 two a byte."""
    return n if kind == "int8" else (n + 1) // 2


def _pack(q: np.ndarray, kind: str) -> bytes:
    """Levels (int8 values from -LEVELS[kind] to LEVELS[kind]) as the body's bytes."""
    if kind == "int8":
        return q.tobytes()
    nibbles = np.zeros(q.size + q.size % 2, dtype=np.uint8)
    nibbles[:q.size] = (q + 8).astype(np.uint8)
    return (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()


def _unpack(body: np.ndarray, kind: str, n: int) -> np.ndarray:
    """The body's bytes (uint8) as ``n`` levels, float64; BadValues for a level out of range."""
    if kind == "int8":
        return body.view("i1").astype(np.float64)
    q = np.stack([body & 15, body >> 4], axis=1).reshape(-1)[:n].astype(np.float64) - 8
    if (q < -LEVELS[kind]).any():
        raise BadValues(f"{kind} values: a value out of range")
    return q


def decode(data: bytes, kind: str, length: int | None = None) -> np.ndarray:
    """``kind`` bytes as values (float32; int8's and int4's in float64, where a 7- or 3-bit value
    times a float32 scale is exact, so the reducer's float64 sum of them does not depend on their order);
    BadValues unless well formed and finite (and ``length`` long)."""
    if kind in LEVELS:
        arr = _decode_blocks(data, kind)
    else:
        dtype = np.dtype("<f4" if kind == "float32" else "<f2")
        if len(data) == 0 or len(data) % dtype.itemsize:
            raise BadValues(f"{kind} values are a non-zero multiple of {dtype.itemsize} bytes, not {len(data)}")
        arr = np.frombuffer(data, dtype=dtype).astype(np.float32)
    if length is not None and arr.size != length:
        raise BadValues(f"{arr.size} values where {length} were expected")
    if not np.isfinite(arr).all():
        raise BadValues("non-finite values")
    return arr


def float32_view(data: bytes, length: int | None = None, chunk: int = 1 << 20) -> np.ndarray:
    """float32 bytes as a read-only view of them (no copy: a whole model after training, 1x the
    model less in the reducer for every contributor), checked finite ``chunk`` values at a time
    (a whole-array check makes a bool array a quarter of the model); BadValues as ``decode``."""
    if len(data) == 0 or len(data) % 4:
        raise BadValues(f"float32 values are a non-zero multiple of 4 bytes, not {len(data)}")
    arr = np.frombuffer(data, dtype="<f4")
    if length is not None and arr.size != length:
        raise BadValues(f"{arr.size} values where {length} were expected")
    for at in range(0, arr.size, chunk):
        if not np.isfinite(arr[at:at + chunk]).all():
            raise BadValues("non-finite values")
    return arr


def _decode_blocks(data: bytes, kind: str) -> np.ndarray:
    if len(data) < _HEAD:
        raise BadValues(f"{kind} values start with a 4-byte count: {len(data)} bytes")
    n = int(np.frombuffer(data[:_HEAD], dtype="<u4")[0])
    blocks = math.ceil(n / BLOCK)
    if n == 0 or len(data) != _HEAD + 4 * blocks + _body_size(n, kind):
        raise BadValues(f"{kind} values: {len(data)} bytes for a count of {n}")
    scale = np.frombuffer(data, dtype="<f4", count=blocks, offset=_HEAD)
    if not np.isfinite(scale).all() or (scale < 0).any():
        raise BadValues(f"{kind} values: a scale not finite and non-negative")
    q = _unpack(np.frombuffer(data, dtype=np.uint8, offset=_HEAD + 4 * blocks), kind, n)
    return q * np.repeat(scale.astype(np.float64), BLOCK)[:n]
