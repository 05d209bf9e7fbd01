"""Packing compressor payloads into bytes (msgpack) and bit-packing helpers.

Not to be confused with ``p2pnode.wire`` (the model payloads nodes exchange); this module
only sizes and round-trips the compression toolbox's payloads (docs/COMPRESSION.md).

A payload is a small tree of dicts, lists, strings, numbers and arrays (torch tensors or numpy
arrays). Arrays travel as ``{"__nd__": [dtype, shape, raw little-endian bytes]}``, the same
"raw bytes + dtype + shape" convention as the node's model codec (``p2pnode.wire.codec``):
msgpack has no array type, and lz4 gains nothing on float data.

:func:`payload_bytes` returns the exact length of :func:`encode`'s output without building
the big byte string: the tree is encoded with empty placeholders for the array bodies and the
body lengths (plus msgpack's bin length prefix) are added back. A test checks it against
``len(encode(p))`` for every compressor, so the figures the benchmarks report are real bytes.

Bit packing is real: ``pack_uint(v, width)`` stores ``width``-bit unsigned codes back to back
(8 signs a byte, 4 ternary codes a byte, 6-bit QSGD codes 4 per 3 bytes), little-endian bit
order within a byte.
"""

from __future__ import annotations

import sys
from typing import Any

import msgpack
import numpy as np
import torch

__all__ = [
    "encode", "decode", "payload_bytes", "pack_bits", "unpack_bits", "pack_uint", "unpack_uint",
    "index_dtype", "ArraySpec",
]

_ND = "__nd__"
_TORCH_TO_NAME: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16",
    torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}
_NAME_TO_TORCH = {v: k for k, v in _TORCH_TO_NAME.items()}
if sys.byteorder != "little":  # pragma: no cover - every platform we run on is little-endian
    raise ImportError("p2pnode.compression.packing assumes a little-endian host")


def _array_parts(a: Any) -> tuple[str, list[int], memoryview]:
    """(dtype name, shape, a byte view of the C-contiguous data) for a tensor or ndarray."""
    if isinstance(a, torch.Tensor):
        t = a.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        name = _TORCH_TO_NAME[t.dtype]
        shape = list(t.shape)
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: ship the 16-bit patterns
            t = t.view(torch.int16)
        arr = t.numpy()
    else:
        arr = np.ascontiguousarray(a)
        name = arr.dtype.name
        shape = list(arr.shape)
    return name, shape, arr.reshape(-1).data.cast("B")


class ArraySpec:
    """Stands for an array of this dtype and shape in :func:`payload_bytes` (size only)."""

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.dtype = dtype
        self.shape = tuple(shape)

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def element_size(self) -> int:
        return torch.empty(0, dtype=self.dtype).element_size()


def _is_array(x: Any) -> bool:
    return isinstance(x, (torch.Tensor, np.ndarray, ArraySpec))


def _default(obj: Any) -> Any:
    if _is_array(obj):
        name, shape, body = _array_parts(obj)
        return {_ND: [name, shape, body]}
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} in a compression payload")


def encode(payload: Any) -> bytes:
    """The msgpack bytes of a payload (what would go on the wire)."""
    return msgpack.packb(payload, default=_default, use_bin_type=True)


def _hook(d: dict) -> Any:
    if len(d) == 1 and _ND in d:
        name, shape, body = d[_ND]
        if name == "bfloat16":
            arr = np.frombuffer(body, dtype=np.int16).copy()
            return torch.from_numpy(arr).view(torch.bfloat16).reshape(shape)
        if name not in _NAME_TO_TORCH:
            raise ValueError(f"unknown array dtype {name!r} in payload")
        arr = np.frombuffer(body, dtype=np.dtype(name)).copy()  # writable, owned
        return torch.from_numpy(arr).reshape(shape)
    return d


def decode(data: bytes) -> Any:
    """Inverse of :func:`encode`; arrays come back as CPU torch tensors."""
    return msgpack.unpackb(data, object_hook=_hook, raw=False, strict_map_key=False)


def _bin_header(n: int) -> int:
    return 2 if n < 256 else 3 if n < 65536 else 5


def _skeleton(x: Any, extra: list[int]) -> Any:
    if _is_array(x):
        if isinstance(x, np.ndarray):
            nbytes, name = x.nbytes, x.dtype.name
        else:
            nbytes, name = x.numel() * x.element_size(), _TORCH_TO_NAME[x.dtype]
        extra.append(_bin_header(nbytes) - 2 + nbytes)  # b"" costs 2 bytes in the skeleton
        return {_ND: [name, list(x.shape), b""]}
    if isinstance(x, dict):
        return {k: _skeleton(v, extra) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_skeleton(v, extra) for v in x]
    return x


def payload_bytes(payload: Any) -> int:
    """Exact length of ``encode(payload)``, computed without copying the array bodies."""
    extra: list[int] = []
    skel = _skeleton(payload, extra)
    return len(msgpack.packb(skel, default=_default, use_bin_type=True)) + sum(extra)


def index_dtype(numel: int) -> torch.dtype:
    """Narrowest signed integer type torch indexes with that holds every index < numel."""
    if numel <= 2**15:
        return torch.int16
    if numel <= 2**31:
        return torch.int32
    return torch.int64


# ------------------------------------------------------------------------------ bit packing

def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Booleans -> uint8, 8 per byte (bit i of byte j is element 8j+i)."""
    arr = mask.reshape(-1).to(torch.bool).numpy()
    return torch.from_numpy(np.packbits(arr, bitorder="little"))


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits` for ``n`` elements."""
    bits = np.unpackbits(packed.numpy().reshape(-1), count=n, bitorder="little")
    return torch.from_numpy(bits.astype(np.bool_, copy=False))


def pack_uint(codes: torch.Tensor, width: int) -> torch.Tensor:
    """Unsigned codes < 2**width (1 <= width <= 8) -> uint8 stream of ``width`` bits each.

    Eight codes fill exactly ``width`` bytes: they are shifted into one int64 (little-endian)
    whose low ``width`` bytes are kept, so every width is vectorised, not only divisors of 8.
    Output length: ceil(n * width / 8) bytes.
    """
    if not 1 <= width <= 8:
        raise ValueError(f"width must be 1..8, got {width}")
    v = codes.reshape(-1).to(torch.uint8)
    n = v.numel()
    if width == 8:
        return v.clone()
    pad = (-n) % 8
    if pad:
        v = torch.cat([v, v.new_zeros(pad)])
    words = (v.view(-1, 8).to(torch.int64) << (torch.arange(8, dtype=torch.int64) * width)).sum(dim=1)
    packed = words.view(torch.uint8).view(-1, 8)[:, :width].reshape(-1)
    return packed[: (n * width + 7) // 8].contiguous()


def unpack_uint(packed: torch.Tensor, width: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_uint`: ``n`` codes as uint8."""
    if not 1 <= width <= 8:
        raise ValueError(f"width must be 1..8, got {width}")
    p = packed.reshape(-1).to(torch.uint8)
    if width == 8:
        return p[:n].clone()
    groups = (n + 7) // 8
    need = groups * width
    if p.numel() < need:
        p = torch.cat([p, p.new_zeros(need - p.numel())])
    b = torch.zeros(groups, 8, dtype=torch.uint8)
    b[:, :width] = p[:need].view(groups, width)
    words = b.view(torch.int64).view(groups, 1)
    codes = (words >> (torch.arange(8, dtype=torch.int64) * width)) & ((1 << width) - 1)
    return codes.reshape(-1)[:n].to(torch.uint8)
