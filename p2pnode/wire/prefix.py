"""Whether the first bytes of a body can begin a model payload of this model.

A payload is one msgpack map (p2pnode.wire.codec); its small fields come before its tensor data
in our encoder, but any order is valid. Reading the map's first fields from a prefix (64 KiB)
tells garbage from a payload long before a 60 MiB body is in: the map header, every key one of
the payload's, ``fmt`` this format, ``fp`` this model's fingerprint. A prefix that ends before
it can tell is let through; the full decode decides then.
"""

from __future__ import annotations

import msgpack

from p2pnode.wire.codec import _COMMON_KEYS, _DELTA_KEYS
from p2pnode.wire.payload import FORMAT_VERSION, ModelSpec

#: bytes of a body examined before the rest is read
PREFIX_BYTES = 64 * 1024


def prefix_error(prefix: bytes, spec: ModelSpec) -> str | None:
    """A one-line reason why ``prefix`` cannot begin a payload of ``spec``'s model, or None."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=len(prefix) + 1,
                                max_bin_len=0, max_ext_len=0, max_array_len=1 << 16, max_map_len=64,
                                max_str_len=1 << 16)
    unpacker.feed(prefix)
    try:
        n = unpacker.read_map_header()
        if not len(_COMMON_KEYS) <= n <= len(_DELTA_KEYS):
            return "not a model payload (not its number of fields)"
        for _ in range(n):
            key = unpacker.unpack()
            if key not in _DELTA_KEYS:
                return "not a model payload (unknown field)"
            if key == "data":
                return None  # the tensor data: the full decode checks them
            value = unpacker.unpack()
            if key == "fmt" and value != FORMAT_VERSION:
                return f"payload format {value!r:.20} is not {FORMAT_VERSION}"
            if key == "fp" and value != spec.fingerprint:
                return "payload of another model (fingerprint)"
    except msgpack.OutOfData:
        return None
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        return f"not a model payload ({exc.__class__.__name__})"
    return None
