"""A strict msgpack reader for model payloads whose binary values are views of the input.

``msgpack.unpackb`` copies every ``bin`` value into a new ``bytes`` object: decoding a 1.4 GB
snapshot held it twice. Here a ``bin`` comes back as a ``memoryview`` slice of the input (no
copy; numpy reads it with ``frombuffer``), and everything else as msgpack would give it. Only
what a payload may hold is read: nil, booleans, integers, floats, strings, bins, arrays and
maps with string keys; extension types are refused. Every length is checked against the input
and the limits before anything is allocated, so a hostile payload costs no more than its bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

_U16, _U32, _U64 = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_F32, _F64 = struct.Struct(">f"), struct.Struct(">d")
_INTS = {0xcc: struct.Struct(">B"), 0xcd: _U16, 0xce: _U32, 0xcf: _U64, 0xd0: _I8, 0xd1: _I16, 0xd2: _I32, 0xd3: _I64}
_LENGTHS = {1: struct.Struct(">B"), 2: _U16, 4: _U32}


#: a payload's bytes as they come: off the wire or the pipe, a big one is a memoryview of a buffer
#: read into once (``big_buffer``)
Body = bytes | bytearray | memoryview


def big_buffer(size: int) -> memoryview:
    """``size`` writable bytes to read a payload into, not zeroed: numpy's empty array (fresh
    pages from the kernel, written once, by the read). ``bytearray(size)`` zeroes its bytes
    holding the GIL: a 400 MB one held the daemon's event loop for 0.3 s."""
    return np.empty(size, np.uint8).data


class Malformed(ValueError):
    """Not a msgpack object we read (truncated, over a limit, an unsupported type)."""


@dataclass(frozen=True)
class Limits:
    max_str: int = 1 << 16
    max_array: int = 1 << 20
    max_map: int = 64
    max_depth: int = 8


def unpack_from(data: bytes | bytearray | memoryview, pos: int = 0, limits: Limits = Limits()) -> tuple[Any, int]:
    """The object starting at ``pos`` and where it ends; bins are views of ``data``."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return _Reader(view, limits).read(pos, 0)


def unpack(data: bytes | bytearray | memoryview, limits: Limits = Limits()) -> Any:
    """The one object ``data`` holds (Malformed if anything follows it)."""
    obj, end = unpack_from(data, 0, limits)
    if end != memoryview(data).nbytes:
        raise Malformed("extra bytes after the object")
    return obj


class _Reader:
    def __init__(self, view: memoryview, limits: Limits) -> None:
        self.v = view
        self.n = view.nbytes
        self.lim = limits

    def _need(self, pos: int, size: int) -> None:
        if size < 0 or pos + size > self.n:
            raise Malformed("truncated")

    def _length(self, pos: int, width: int) -> tuple[int, int]:
        self._need(pos, width)
        return _LENGTHS[width].unpack_from(self.v, pos)[0], pos + width

    def read(self, pos: int, depth: int) -> tuple[Any, int]:
        self._need(pos, 1)
        b = self.v[pos]
        pos += 1
        if b <= 0x7f:
            return b, pos
        if b >= 0xe0:
            return b - 0x100, pos
        if 0x80 <= b <= 0x8f:
            return self._map(pos, b & 0x0f, depth)
        if 0x90 <= b <= 0x9f:
            return self._array(pos, b & 0x0f, depth)
        if 0xa0 <= b <= 0xbf:
            return self._str(pos, b & 0x1f)
        if b == 0xc0:
            return None, pos
        if b in (0xc2, 0xc3):
            return b == 0xc3, pos
        if b in (0xc4, 0xc5, 0xc6):
            size, pos = self._length(pos, 1 << (b - 0xc4))
            self._need(pos, size)
            return self.v[pos:pos + size], pos + size
        if b in _INTS:
            s = _INTS[b]
            self._need(pos, s.size)
            return s.unpack_from(self.v, pos)[0], pos + s.size
        if b in (0xca, 0xcb):
            f = _F32 if b == 0xca else _F64
            self._need(pos, f.size)
            return f.unpack_from(self.v, pos)[0], pos + f.size
        if b in (0xd9, 0xda, 0xdb):
            size, pos = self._length(pos, 1 << (b - 0xd9))
            return self._str(pos, size)
        if b in (0xdc, 0xdd):
            size, pos = self._length(pos, 2 if b == 0xdc else 4)
            return self._array(pos, size, depth)
        if b in (0xde, 0xdf):
            size, pos = self._length(pos, 2 if b == 0xde else 4)
            return self._map(pos, size, depth)
        raise Malformed(f"unsupported msgpack type 0x{b:02x}")

    def _str(self, pos: int, size: int) -> tuple[str, int]:
        if size > self.lim.max_str:
            raise Malformed("string too long")
        self._need(pos, size)
        try:
            return str(self.v[pos:pos + size], "utf-8"), pos + size
        except UnicodeDecodeError:
            raise Malformed("string not utf-8") from None

    def _array(self, pos: int, size: int, depth: int) -> tuple[list[Any], int]:
        if size > self.lim.max_array or size > self.n - pos:  # every item takes a byte at least
            raise Malformed("array too long")
        if depth >= self.lim.max_depth:
            raise Malformed("nested too deep")
        out = []
        for _ in range(size):
            item, pos = self.read(pos, depth + 1)
            out.append(item)
        return out, pos

    def _map(self, pos: int, size: int, depth: int) -> tuple[dict[str, Any], int]:
        if size > self.lim.max_map:
            raise Malformed("map too long")
        if depth >= self.lim.max_depth:
            raise Malformed("nested too deep")
        out: dict[str, Any] = {}
        for _ in range(size):
            key, pos = self.read(pos, depth + 1)
            if not isinstance(key, str) or key in out:
                raise Malformed("map key not a string, or repeated")
            out[key], pos = self.read(pos, depth + 1)
        return out, pos
