"""The reducer's answer to a contribution, as msgpack, with a model-sized mean never copied.

Why: after training every node sends its whole model and every contributor is answered with the
models' mean (1x the model in float32). Packed by ``msgpack.packb`` the mean was copied into each
contributor's answer: four answers at 124M parameters were 2 GB on top of the bodies and the
mean, and the 4-node GPT-2 run in the synchronous mode ran out of memory at its finish. Here the
answer is the same msgpack bytes, made of three parts: the map up to the ``data`` field's
header, the mean itself (shared by every answer), the fields after it; streamed a slice at a
time (``net/stream.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import msgpack
from aiohttp import web

from p2pnode.net.client import MSGPACK
from p2pnode.net.stream import SLICE, PartsResponse, sha256_of

#: the field that holds the mean's bytes
BLOB = "data"


def bin_header(n: int) -> bytes:
    """msgpack's header of a bin of ``n`` bytes (bin 8, 16 or 32)."""
    if n < 1 << 8:
        return b"\xc4" + struct.pack(">B", n)
    if n < 1 << 16:
        return b"\xc5" + struct.pack(">H", n)
    if n < 1 << 32:
        return b"\xc6" + struct.pack(">I", n)
    raise ValueError(f"a msgpack bin holds under 4 GiB, not {n} bytes")


def parts_of(fields: Mapping[str, Any]) -> list[bytes | memoryview]:
    """``msgpack.packb(fields, use_bin_type=True)`` as parts, the ``data`` field's bytes among
    them as they are (not copied); the same bytes once joined."""
    packer = msgpack.Packer(use_bin_type=True)
    head = bytearray(packer.pack_map_header(len(fields)))
    out: list[bytes | memoryview] = []
    for key, value in fields.items():
        head += packer.pack(key)
        if key == BLOB and isinstance(value, (bytes, bytearray, memoryview)):
            blob = memoryview(value).cast("B")
            head += bin_header(blob.nbytes)
            out += [bytes(head), blob]
            head = bytearray()
        else:
            head += packer.pack(value)
    out.append(bytes(head))
    return out


def answer(fields: Mapping[str, Any]) -> tuple[web.StreamResponse, int]:
    """The answer (one msgpack body, streamed from its parts when its ``data`` is big) and its
    length in bytes."""
    blob = fields.get(BLOB)
    if isinstance(blob, (bytes, bytearray, memoryview)) and memoryview(blob).nbytes > SLICE:
        parts = parts_of(fields)
        resp = PartsResponse(parts, lambda: sha256_of(parts), content_type=MSGPACK)
        return resp, resp.nbytes
    body = msgpack.packb(dict(fields), use_bin_type=True)
    return web.Response(body=body, content_type=MSGPACK), len(body)
