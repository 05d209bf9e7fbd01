"""Model payload codec: snapshots and sparse deltas of a node's public model x̂.

One payload is one msgpack map (see docs/PROTOCOL.md, "Payload format"). It is
self-describing (format version, kind, architecture fingerprint, node id, epoch, versions,
step, loss, tensor names/shapes/dtypes) so a receiver can refuse a foreign model before any
number of it touches ours. Tensor data travel as raw little-endian bytes: lz4 gains nothing
on random float32 values, so it is used only on delta indices, and only when it pays.

The payload's parts are in payload.py, the rounding of int8 and float16 values in
rounding.py. :func:`decode` never trusts its input: every malformed payload raises :class:`PayloadError`
(a ``ValueError``) with a short reason, before the caller can act on any part of it. All
per-element work is vectorised numpy; there is no Python loop over elements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Mapping

import lz4.block
import msgpack
import numpy as np

from p2pnode.wire.payload import (
    DELTA_OPS,
    FORMAT_VERSION,
    KINDS,
    TENSOR_DTYPES,
    ArchitectureMismatch,
    Delta,
    Header,
    ModelSpec,
    NonFiniteError,
    Payload,
    PayloadError,
    Snapshot,
    TensorSpec,
    mismatch,
)
from p2pnode.wire.msgview import Malformed, big_buffer, unpack, unpack_from
from p2pnode.wire.rounding import INT8_EXPONENTS, int8_exponent

#: indices are < numel, so with this bound a uint32 always holds an index, and the uint64
#: running sum of n <= numel gaps (each < 2**32) can never wrap.
MAX_TENSOR_NUMEL = 2**32 - 1
MAX_TENSORS = 1 << 16
MAX_NDIM = 16
MAX_NAME_LEN = 1024
MAX_ID_LEN = 256
MAX_VERSION = 2**63 - 1
DEFAULT_MAX_BYTES = 256 * 1024 * 1024

#: Wire encodings of float values ("vdt" field). Decoded values are always float32.
VALUE_DTYPES: dict[str, np.dtype] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2"), "int8": np.dtype("i1")}
#: Index gap widths in bytes ("w" field of a delta entry).
INDEX_WIDTHS: dict[int, np.dtype] = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}

_COMMON_KEYS = frozenset(
    {"fmt", "kind", "fp", "node", "epoch", "base", "ver", "step", "loss", "vdt", "specs", "data"}
)
_DELTA_KEYS = _COMMON_KEYS | {"op"}
_ENTRY_KEYS = frozenset({"t", "n", "w", "z", "i", "v"})
_INT8_ENTRY_KEYS = _ENTRY_KEYS | {"e"}  # int8 values: the entry's power-of-two exponent


def max_encoded_bytes(spec: ModelSpec) -> int:
    """The largest payload of this model an honest peer can send: a delta naming every element
    (a 4-byte index gap and a float32 value each) with its framing and header. A snapshot (4
    bytes an element) is smaller, and so is a chain (served only when smaller than one merged
    delta). What a peer may send us follows from our model, not from a constant."""
    per_tensor = sum(2 * len(t.name.encode()) + 96 + 9 * len(t.shape) for t in spec.tensors)
    return 8 * spec.numel + per_tensor + 64 * 1024


def payload_limit(spec: ModelSpec, override: int = 0) -> int:
    """The largest payload taken from a peer: :func:`max_encoded_bytes`, capped by
    ``http.max_payload_bytes`` where that is set (``override`` > 0)."""
    bound = max_encoded_bytes(spec)
    return min(bound, override) if override > 0 else bound


# ---------------------------------------------------------------------------------- encode


def _int8_entry(name: str, values: Any, count: int) -> tuple[np.ndarray, int]:
    a = np.asarray(values, dtype=np.float32).reshape(-1)
    if a.size != count:
        raise ValueError(f"{name}: {a.size} values, expected {count}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: non-finite values")
    maxabs = float(np.abs(a).max()) if a.size else 0.0
    e = int8_exponent(maxabs) if maxabs else 0
    k = np.ldexp(a, -e)
    if not INT8_EXPONENTS[0] <= e <= INT8_EXPONENTS[1] or (k != np.rint(k)).any():
        raise ValueError(f"{name}: values not rounded for int8 (round_int8 first)")
    return k.astype(np.int8), e


#: elements checked at once for NaN and infinity (a whole big tensor's boolean mask is a
#: quarter of its bytes again)
FINITE_CHUNK = 1 << 20


def all_finite(a: np.ndarray) -> bool:
    """Whether every element of the flat array ``a`` is finite, a chunk at a time."""
    return all(np.isfinite(a[at:at + FINITE_CHUNK]).all() for at in range(0, a.size, FINITE_CHUNK))


def _values_array(name: str, values: Any, count: int, vdt: np.dtype) -> np.ndarray:
    """The values, flat, in the wire's type (no copy when they already are: float32 on a
    little-endian machine), checked."""
    a = np.asarray(values, dtype=np.float32).reshape(-1)
    if a.size != count:
        raise ValueError(f"{name}: {a.size} values, expected {count}")
    if not all_finite(a):
        raise ValueError(f"{name}: non-finite values")
    with np.errstate(over="ignore"):
        w = a.astype(vdt, copy=False)
    if vdt.itemsize < 4 and not all_finite(w):
        raise ValueError(f"{name}: values overflow {vdt.name}")
    return w


def _bin_header(n: int) -> bytes:
    """msgpack's own header for a bin of ``n`` bytes (the narrowest, as packb writes it)."""
    if n < 1 << 8:
        return bytes((0xc4, n))
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def encode_parts(snapshot: Snapshot, value_dtype: str = "float32") -> list[bytes | memoryview]:
    """A snapshot's encoding as parts whose concatenation is :func:`encode`'s bytes: the header,
    then each tensor's values *as they lie in memory* (float32 arrays are not copied; keep them
    unchanged while the parts are in use). What a server streams a big model from."""
    return list(iter_parts(snapshot, value_dtype))


def iter_parts(snapshot: Snapshot, value_dtype: str = "float32") -> Iterator[bytes | memoryview]:
    """:func:`encode_parts` one part at a time, each tensor looked up in ``snapshot.tensors``
    only when its part is due: with a mapping that reads a tensor when asked (a big model's
    file), no more than one tensor is held at once."""
    h = snapshot.header
    if value_dtype not in VALUE_DTYPES:
        raise ValueError(f"unknown value dtype {value_dtype!r}")
    if value_dtype == "int8":
        value_dtype = "float32"  # a snapshot is x_hat itself: exact (int8 is for deltas only)
    vdt = VALUE_DTYPES[value_dtype]
    if math.isinf(h.loss):
        raise ValueError("infinite loss")
    if h.kind != "snapshot":
        raise ValueError(f"header kind {h.kind!r} on a snapshot")
    if set(snapshot.tensors) != {s.name for s in h.specs}:
        raise ValueError("snapshot tensors do not match header specs")
    head: dict[str, Any] = {
        "fmt": FORMAT_VERSION, "kind": "snapshot", "fp": h.fingerprint, "node": h.node_id,
        "epoch": h.epoch, "base": int(h.base_version), "ver": int(h.version),
        "step": int(h.step), "loss": float(h.loss), "vdt": value_dtype,
        "specs": [[s.name, list(s.shape), s.dtype] for s in h.specs],
    }
    packed = msgpack.packb(head, use_bin_type=True)  # a fixmap of 11: one more entry follows
    yield bytes((packed[0] + 1,)) + packed[1:] + msgpack.packb("data") + msgpack.Packer().pack_array_header(len(h.specs))
    for s in h.specs:
        w = _values_array(s.name, snapshot.tensors[s.name], s.numel, vdt)
        yield _bin_header(w.nbytes)
        yield np.ascontiguousarray(w).data.cast("B")


def _gaps(name: str, idx: Any, numel: int) -> np.ndarray | None:
    """The indices delta-coded (first index, then gaps), checked; None when there are none."""
    idx = np.asarray(idx)
    if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"{name}: indices must be a 1-d integer array")
    if idx.size == 0:
        return None
    idx = idx.astype(np.int64, copy=False)
    gaps = np.diff(idx, prepend=0)
    if idx[0] < 0 or idx[-1] >= numel or (gaps[1:] <= 0).any():
        raise ValueError(f"{name}: indices must be strictly increasing in [0, {numel})")
    return gaps


def _gap_code(gaps: np.ndarray) -> tuple[int, int, bytes | np.ndarray]:
    """(width, lz4 or not, bytes): the gaps in the narrowest width, lz4 if smaller."""
    top = int(gaps.max())
    width = 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4
    raw = gaps.astype(INDEX_WIDTHS[width])
    packed = lz4.block.compress(raw, store_size=False)
    return (width, 1, packed) if len(packed) < raw.nbytes else (width, 0, raw)


def _one_byte_gaps(gaps: np.ndarray, extra: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every gap over 255 split by ``extra`` (per gap: ``(gap - 1) // 255``) zero-valued entries
    255 apart, so that one byte holds each gap: (the new gaps, where the real entries are among
    them). At a top-k density of 1-2 % a gap is over 255 only now and then, and a 2-byte width
    for all of them costs about twice the few entries added (at the lowest bytes measured)."""
    at = np.cumsum(extra + 1) - 1
    out = np.full(int(at[-1]) + 1, 255, np.int64)
    out[at] = gaps - 255 * extra
    return out, at


def _index_entry(name: str, t: int, idx: Any, values: Any, numel: int, value_bytes: int,
                 add: bool) -> tuple[dict[str, Any] | None, np.ndarray]:
    """The entry's index part and its values (float32, flat). For an ``add`` delta, when it
    makes the entry smaller, gaps over 255 are split by zero-valued entries (adding zero
    changes nothing: every decoder applies the same values; docs/PROTOCOL.md)."""
    gaps = _gaps(name, idx, numel)
    vals = np.asarray(values, dtype=np.float32).reshape(-1)
    if gaps is None:
        if vals.size:
            raise ValueError(f"{name}: values without indices")
        return None, vals
    if vals.size != gaps.size:
        raise ValueError(f"{name}: {vals.size} values, expected {gaps.size}")
    width, z, coded = _gap_code(gaps)
    if add and width > 1:
        extra = np.maximum(gaps - 1, 0) // 255
        if int(extra.sum()) * (1 + value_bytes) < gaps.size * (width - 1):  # it can pay: try it
            filled, at = _one_byte_gaps(gaps, extra)
            fz, fcoded = _gap_code(filled)[1:]
            if _nbytes(fcoded) + filled.size * value_bytes < _nbytes(coded) + gaps.size * value_bytes:
                full = np.zeros(filled.size, np.float32)
                full[at] = vals
                gaps, vals, width, z, coded = filled, full, 1, fz, fcoded
    return {"t": t, "n": int(gaps.size), "w": width, "z": z, "i": coded}, vals


def encode(payload: Payload, value_dtype: str = "float32") -> bytes:
    """Encode a payload; ``value_dtype="float16"`` halves value bytes (lossy: whoever keeps
    x̂ must apply the *decoded* values, so that sender and receivers stay bit-equal).
    Raises ``ValueError`` on an inconsistent payload (never emits what decode would refuse)."""
    if isinstance(payload, Snapshot):
        return join(encode_parts(payload, value_dtype))  # one copy of the values, not two
    return join(delta_parts(payload, value_dtype))


def delta_parts(payload: Delta, value_dtype: str = "float32") -> list[bytes | memoryview]:
    """A delta's encoding as parts whose concatenation is :func:`encode`'s bytes, each entry's
    arrays *as they lie in memory* (keep them unchanged while the parts are in use): what a
    worker sends down its pipe without joining a body first (a whole publish of a 503 MB model
    held its values and a joined copy of them at once)."""
    h = payload.header
    if value_dtype not in VALUE_DTYPES:
        raise ValueError(f"unknown value dtype {value_dtype!r}")
    vdt = VALUE_DTYPES[value_dtype]
    if math.isinf(h.loss):
        raise ValueError("infinite loss")
    if h.kind != "delta":
        raise ValueError(f"header kind {h.kind!r} on a delta")
    obj: dict[str, Any] = {
        "fmt": FORMAT_VERSION, "kind": "delta", "fp": h.fingerprint, "node": h.node_id,
        "epoch": h.epoch, "base": int(h.base_version), "ver": int(h.version),
        "step": int(h.step), "loss": float(h.loss), "vdt": value_dtype,
        "specs": [[s.name, list(s.shape), s.dtype] for s in h.specs],
    }
    if h.op not in DELTA_OPS:
        raise ValueError(f"unknown delta op {h.op!r}")
    obj["op"] = h.op
    unknown = set(payload.entries) - {s.name for s in h.specs}
    if unknown:
        raise ValueError(f"delta entries for unknown tensors: {sorted(unknown)[:3]}")
    data = []
    value_bytes = 1 if value_dtype == "int8" else vdt.itemsize
    for t, s in enumerate(h.specs):
        if s.name not in payload.entries:
            continue
        idx, vals = payload.entries[s.name]
        entry, vals = _index_entry(s.name, t, idx, vals, s.numel, value_bytes, h.op == "add")
        if entry is None:
            continue
        if value_dtype == "int8":
            entry["v"], entry["e"] = _int8_entry(s.name, vals, entry["n"])
        else:
            entry["v"] = _values_array(s.name, vals, entry["n"], vdt)
        data.append(entry)
    obj["data"] = data
    return _pack(obj)


def _nbytes(b: bytes | np.ndarray) -> int:
    return b.nbytes if isinstance(b, np.ndarray) else len(b)


def _pack(obj: Any, parts: list[bytes | memoryview] | None = None) -> list[bytes | memoryview]:
    """``obj`` as msgpack, in parts: what ``msgpack.packb`` writes, byte for byte, except that an
    array's values are a view of it, not a copy (packb copies every bin holding the GIL: a
    400 MB delta held a daemon's event loop for seconds)."""
    parts = [] if parts is None else parts
    if isinstance(obj, dict):
        parts.append(msgpack.Packer().pack_map_header(len(obj)))
        for k, v in obj.items():
            parts.append(msgpack.packb(k))
            _pack(v, parts)
    elif isinstance(obj, list):
        parts.append(msgpack.Packer().pack_array_header(len(obj)))
        for v in obj:
            _pack(v, parts)
    elif isinstance(obj, np.ndarray):
        view = np.ascontiguousarray(obj).data.cast("B")
        parts += [_bin_header(view.nbytes), view]
    else:
        parts.append(msgpack.packb(obj, use_bin_type=True))
    return parts


def join(parts: list[bytes | memoryview]) -> bytes:
    """The parts as one ``bytes`` (one copy)."""
    return b"".join(parts)


def join_body(parts: Sequence[bytes | bytearray | memoryview]) -> bytes | memoryview:
    """The parts as one buffer, copied by numpy (which lets go of the GIL) into a buffer that is
    not zeroed first, when they are big: what a daemon thread encodes with, beside its event loop."""
    total = sum(memoryview(p).nbytes for p in parts)
    if total <= 1 << 20:
        return b"".join(parts)
    out = big_buffer(total)
    dst = np.frombuffer(out, np.uint8)
    at = 0
    for p in parts:
        src = np.frombuffer(p, np.uint8)
        dst[at:at + src.size] = src
        at += src.size
    return out


def encode_body(payload: Payload, value_dtype: str = "float32") -> bytes | memoryview:
    """:func:`encode`'s bytes, joined without holding the GIL for long (``join_body``)."""
    if isinstance(payload, Snapshot):
        return join_body(encode_parts(payload, value_dtype))
    return join_body(delta_parts(payload, value_dtype))


# ---------------------------------------------------------------------------------- decode


def _field(obj: Mapping[str, Any], key: str, typ: type | tuple[type, ...]) -> Any:
    v = obj[key]
    if isinstance(v, bool) and typ is not bool or not isinstance(v, typ):
        raise PayloadError(f"field {key!r} has the wrong type")
    return v


def _int(obj: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    v = _field(obj, key, int)
    if not lo <= v <= hi:
        raise PayloadError(f"field {key!r} out of range")
    return v


def _str(obj: Mapping[str, Any], key: str, max_len: int = MAX_ID_LEN) -> str:
    v = _field(obj, key, str)
    if not 0 < len(v) <= max_len:
        raise PayloadError(f"field {key!r} empty or too long")
    return v


def _specs(raw: Any) -> list[TensorSpec]:
    if not isinstance(raw, list) or len(raw) > MAX_TENSORS:
        raise PayloadError("bad specs")
    specs, names = [], set()
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3):
            raise PayloadError("bad tensor spec")
        name, shape, dtype = item
        if not (isinstance(name, str) and 0 < len(name) <= MAX_NAME_LEN) or name in names:
            raise PayloadError("bad or duplicate tensor name")
        if not (isinstance(shape, list) and len(shape) <= MAX_NDIM and all(
                type(d) is int and d >= 0 for d in shape)):
            raise PayloadError(f"{name}: bad shape")
        if dtype not in TENSOR_DTYPES:
            raise PayloadError(f"{name}: unsupported dtype")
        spec = TensorSpec(name, tuple(shape), dtype)
        if spec.numel > MAX_TENSOR_NUMEL:
            raise PayloadError(f"{name}: tensor too large")
        names.add(name)
        specs.append(spec)
    return specs


#: what :func:`decode` calls with each part of the input it has checked (a view of it; a mapped
#: body's pages then leave the resident set: wire/mapped.py)
Release = Callable[[np.ndarray], None]


def _values(name: str, raw: Any, count: int, vdt: np.dtype, release: Release | None = None) -> np.ndarray:
    if not isinstance(raw, memoryview) or raw.nbytes != count * vdt.itemsize:
        raise PayloadError(f"{name}: value bytes do not match the element count")
    a = np.frombuffer(raw, dtype=vdt).astype(np.float32, copy=False)
    if not all_finite(a):
        raise NonFiniteError(f"{name}: non-finite values")
    if release is not None:
        release(np.frombuffer(raw, np.uint8))
    return a


def _indices(name: str, e: Mapping[str, Any], numel: int, release: Release | None = None) -> np.ndarray:
    n = _int(e, "n", 1, numel)
    width = _int(e, "w", 1, 4)
    z = _int(e, "z", 0, 1)
    raw = _field(e, "i", memoryview)
    if width not in INDEX_WIDTHS:
        raise PayloadError(f"{name}: bad index width")
    size = n * width
    if z:  # the known count bounds the output: no lz4 bomb can make us allocate more
        try:
            raw = lz4.block.decompress(raw, uncompressed_size=size)
        except Exception:
            raise PayloadError(f"{name}: corrupt lz4 indices") from None
    if len(raw) != size:
        raise PayloadError(f"{name}: index bytes do not match the count")
    gaps = np.frombuffer(raw, dtype=INDEX_WIDTHS[width])
    if n > 1 and not gaps[1:].all():
        raise PayloadError(f"{name}: indices not strictly increasing")
    # n <= numel < 2**32 gaps < 2**32: cannot wrap. Widened first, summed in place: numpy's
    # cumsum with a dtype to cast to held the GIL (2 s for 50M indices, the daemon's loop with it)
    idx = gaps.astype(np.uint64)
    if release is not None:
        release(np.frombuffer(raw, np.uint8))
    np.cumsum(idx, out=idx)
    if int(idx[-1]) >= numel:
        raise PayloadError(f"{name}: index out of range")
    return idx.view(np.int64)  # every index < 2**32: the same values


#: most payloads one answer may chain (``GET /v1/model?chain=1``: the deltas since ``since``)
MAX_CHAIN = 64


def split_chain(data: bytes | bytearray | memoryview, max_parts: int = MAX_CHAIN) -> list[memoryview]:
    """The payloads of a chained answer, in order: encoded payloads back to back (msgpack
    objects delimit themselves). One payload gives a list of one. Only the framing is read
    here, under the same size limits as :func:`decode`; each part (a view of ``data``, not a
    copy) is decoded and validated by it after. Raises :class:`PayloadError` on anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PayloadError("payload is not bytes")
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
    parts: list[memoryview] = []
    start = 0
    while start < view.nbytes:
        if len(parts) == max_parts:
            raise PayloadError(f"more than {max_parts} payloads in one answer")
        try:
            _, end = unpack_from(view, start)
        except Malformed as exc:
            raise PayloadError(f"not a msgpack payload ({exc})") from None
        parts.append(view[start:end])
        start = end
    if not parts:
        raise PayloadError("empty payload")
    return parts


def decode(data: bytes | bytearray | memoryview, expect: ModelSpec | None = None,
           max_bytes: int = DEFAULT_MAX_BYTES, release: Release | None = None) -> Payload:
    """Decode and fully validate a payload; raise :class:`PayloadError` on anything wrong.

    ``expect`` (the local model) turns a foreign fingerprint or tensor layout into
    :class:`ArchitectureMismatch`. Never unpickles; msgpack is read with size limits, and the
    tensors' values come back as numpy views of ``data`` (no copy of a big model: keep
    ``data`` unchanged while they are in use). ``release`` is called with each tensor's bytes
    once they are checked (a mapped body lets their pages go: wire/mapped.py).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PayloadError("payload is not bytes")
    size = memoryview(data).nbytes
    if size > max_bytes:
        raise PayloadError(f"payload too large ({size} > {max_bytes} bytes)")
    try:
        obj = unpack(data)
    except Malformed as exc:
        raise PayloadError(f"not a msgpack payload ({exc})") from None
    if release is not None:  # the framing's pages, touched at every tensor's start
        release(np.frombuffer(data, np.uint8))
    if not isinstance(obj, dict):
        raise PayloadError("payload is not a map")
    if "fmt" not in obj or type(obj["fmt"]) is not int:
        raise PayloadError("missing format version")
    if obj["fmt"] != FORMAT_VERSION:
        raise PayloadError(f"unknown format version {obj['fmt']}")
    kind = obj.get("kind")
    if kind not in KINDS:
        raise PayloadError("unknown payload kind")
    if set(obj) != (_DELTA_KEYS if kind == "delta" else _COMMON_KEYS):
        raise PayloadError("missing or unknown fields")

    fp = _str(obj, "fp")
    if expect is not None and fp != expect.fingerprint:
        raise ArchitectureMismatch(mismatch(fp, expect.fingerprint))
    version = _int(obj, "ver", 0, MAX_VERSION)
    if kind == "delta":
        base = _int(obj, "base", 0, version - 1)
        op = obj["op"]
        if op not in DELTA_OPS:
            raise PayloadError("unknown delta op")
    else:
        base = _int(obj, "base", -1, version)
        if base not in (-1, version):
            raise PayloadError("snapshot base version must be -1 or its version")
        op = "add"
    loss = float(_field(obj, "loss", (float, int)))
    if math.isinf(loss):  # NaN is allowed: "no loss yet" (a node that has not trained)
        raise NonFiniteError("infinite loss")
    vdt_name = obj["vdt"]
    if vdt_name not in VALUE_DTYPES:
        raise PayloadError("unknown value dtype")
    vdt = VALUE_DTYPES[vdt_name]
    specs = _specs(obj["specs"])
    if expect is not None and specs != expect.tensors:
        raise ArchitectureMismatch("tensor names, shapes or dtypes differ")
    header = Header(kind=kind, fingerprint=fp, node_id=_str(obj, "node"),
                    epoch=_str(obj, "epoch"), base_version=base, version=version,
                    step=_int(obj, "step", 0, MAX_VERSION), loss=loss, specs=specs, op=op,
                    value_dtype=vdt_name)

    raw_data = obj["data"]
    if not isinstance(raw_data, list):
        raise PayloadError("bad data field")
    if kind == "snapshot":
        if vdt_name == "int8":
            raise PayloadError("int8 values in a snapshot")
        if len(raw_data) != len(specs):
            raise PayloadError("tensor count does not match specs")
        tensors = {s.name: _values(s.name, b, s.numel, vdt, release) for s, b in zip(specs, raw_data)}
        return Snapshot(header, tensors)

    entries: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    last = -1
    for e in raw_data:
        if not isinstance(e, dict) or set(e) != (_INT8_ENTRY_KEYS if vdt_name == "int8" else _ENTRY_KEYS):
            raise PayloadError("bad delta entry")
        t = _int(e, "t", last + 1, len(specs) - 1)  # increasing: no tensor twice
        last = t
        s = specs[t]
        idx = _indices(s.name, e, s.numel, release)
        vals = _values(s.name, e["v"], idx.size, vdt, release)
        if vdt_name == "int8":
            vals = np.ldexp(vals, _int(e, "e", *INT8_EXPONENTS)).astype(np.float32)
        entries[s.name] = (idx, vals)
    return Delta(header, entries)
