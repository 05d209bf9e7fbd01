"""Payload codec: round trips, coding choices, and refusal of every kind of bad input."""

from __future__ import annotations

import lz4.block
import msgpack
import numpy as np
import pytest

from p2pnode.wire.codec import decode, encode
from p2pnode.wire.payload import (
    ArchitectureMismatch,
    Delta,
    ModelSpec,
    NonFiniteError,
    PayloadError,
    Snapshot,
    TensorSpec,
)
from p2pnode.wire.rounding import round_int8

SPEC = ModelSpec("fp0", [TensorSpec("w", (40, 30)), TensorSpec("b", (30,)),
                         TensorSpec("big", (100_000,)), TensorSpec("empty", (0,))])


def snapshot(seed: int = 0, version: int = 7) -> Snapshot:
    rng = np.random.default_rng(seed)
    tensors = {s.name: rng.standard_normal(s.numel).astype(np.float32) for s in SPEC.tensors}
    return Snapshot(SPEC.header("snapshot", "node-a", "ep1", version, step=3, loss=0.5), tensors)


def delta(entries: dict, base: int = 7, op: str = "add") -> Delta:
    return Delta(SPEC.header("delta", "node-a", "ep1", base + 1, base_version=base, step=4,
                             loss=0.25, op=op), entries)


def sample_delta(seed: int = 0) -> Delta:
    rng = np.random.default_rng(seed)
    idx_w = np.sort(rng.choice(1200, 50, replace=False))
    idx_big = np.sort(rng.choice(100_000, 300, replace=False))
    return delta({"w": (idx_w, rng.standard_normal(50).astype(np.float32)),
                  "big": (idx_big, rng.standard_normal(300).astype(np.float32))})


def raw(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False)


def repack(obj: dict) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# ----------------------------------------------------------------------------- round trips


def test_snapshot_round_trip() -> None:
    snap = snapshot()
    out = decode(encode(snap), SPEC, max_bytes=10**7)
    assert isinstance(out, Snapshot)
    h = out.header
    assert (h.kind, h.fingerprint, h.node_id, h.epoch, h.version, h.step, h.loss) == (
        "snapshot", "fp0", "node-a", "ep1", 7, 3, 0.5)
    assert h.specs == SPEC.tensors and h.value_dtype == "float32"
    for name, a in snap.tensors.items():
        assert out.tensors[name].dtype == np.float32
        assert np.array_equal(out.tensors[name], a)


def test_snapshot_is_raw_float32_sized() -> None:
    data = encode(snapshot())
    assert SPEC.numel * 4 < len(data) < SPEC.numel * 4 + 400


def test_delta_round_trip_and_omits_empty() -> None:
    d = sample_delta()
    d.entries["b"] = (np.array([], np.int64), np.array([], np.float32))
    out = decode(encode(d), SPEC)
    assert isinstance(out, Delta)
    assert (out.header.base_version, out.header.version, out.header.op) == (7, 8, "add")
    assert set(out.entries) == {"w", "big"}
    for name, (idx, vals) in d.entries.items():
        if len(idx):
            assert np.array_equal(out.entries[name][0], idx)
            assert out.entries[name][0].dtype == np.int64
            assert np.array_equal(out.entries[name][1], vals)


def test_delta_set_op_round_trips() -> None:
    d = sample_delta()
    d.header.op = "set"
    assert decode(encode(d), SPEC).header.op == "set"


def test_float16_values_flagged_and_smaller() -> None:
    d = sample_delta()
    b32, b16 = encode(d), encode(d, "float16")
    assert raw(b16)["vdt"] == "float16" and raw(b32)["vdt"] == "float32"
    assert len(b16) < len(b32) - 600
    out = decode(b16, SPEC)
    assert out.header.value_dtype == "float16"
    for name, (_, vals) in d.entries.items():
        got = out.entries[name][1]
        assert got.dtype == np.float32
        assert np.array_equal(got, vals.astype(np.float16).astype(np.float32))


def test_int8_values_round_trip_exactly_and_smaller() -> None:
    d = sample_delta()
    rounded = delta({k: (i, round_int8(v)) for k, (i, v) in d.entries.items()})
    b32, b8 = encode(rounded), encode(rounded, "int8")
    assert raw(b8)["vdt"] == "int8" and all("e" in e for e in raw(b8)["data"])
    assert len(b8) < len(b32) - 3 * 350 + 100  # 3 bytes less a value, a few for the exponents
    out = decode(b8, SPEC)
    for name, (_, vals) in rounded.entries.items():
        got = out.entries[name][1]
        assert got.dtype == np.float32 and np.array_equal(got, vals)  # bit-equal: replicas stay in step
        orig = d.entries[name][1]
        assert np.abs(got - orig).max() <= np.abs(orig).max() / 127  # within half a step of 2**e <= max/127*2


def test_int8_needs_rounded_values_and_never_carries_a_snapshot() -> None:
    with pytest.raises(ValueError, match="round_int8"):
        encode(sample_delta(), "int8")  # unrounded values would leave the sender's x_hat out of step
    snap = snapshot()
    out = decode(encode(snap, "int8"), SPEC, max_bytes=10**7)  # a snapshot stays exact
    assert out.header.value_dtype == "float32"
    assert all(np.array_equal(out.tensors[k], v) for k, v in snap.tensors.items())
    obj = raw(encode(snap))
    obj["vdt"] = "int8"
    with pytest.raises(PayloadError, match="snapshot"):
        decode(repack(obj), SPEC, max_bytes=10**7)


def test_int8_entry_without_its_exponent_refused() -> None:
    d = sample_delta()
    obj = raw(encode(delta({k: (i, round_int8(v)) for k, (i, v) in d.entries.items()}), "int8"))
    del obj["data"][0]["e"]
    with pytest.raises(PayloadError):
        decode(repack(obj), SPEC)
    obj = raw(encode(d))  # float32 entries with an exponent: not ours either
    obj["data"][0]["e"] = 3
    with pytest.raises(PayloadError):
        decode(repack(obj), SPEC)


def test_float16_overflow_refused_by_encoder() -> None:
    d = delta({"b": (np.array([1]), np.array([1e6], np.float32))})
    with pytest.raises(ValueError):
        encode(d, "float16")


@pytest.mark.parametrize(("idx", "width"), [([0, 3, 200, 455], 1), ([0, 1000], 2)])
def test_index_width_small(idx: list[int], width: int) -> None:
    d = delta({"w": (np.array(idx), np.ones(len(idx), np.float32))})
    assert raw(encode(d))["data"][0]["w"] == width
    assert np.array_equal(decode(encode(d), SPEC).entries["w"][0], idx)


def test_index_width_32_bits() -> None:
    idx = np.array([2, 99_999])
    entry = raw(encode(delta({"big": (idx, np.ones(2, np.float32))})))["data"][0]
    assert entry["w"] == 4
    first = np.array([70_000])  # a large first index also needs 4 bytes
    assert raw(encode(delta({"big": (first, np.ones(1, np.float32))})))["data"][0]["w"] == 4


def dense(entries: tuple[np.ndarray, np.ndarray], numel: int) -> np.ndarray:
    out = np.zeros(numel, np.float32)
    np.add.at(out, entries[0], entries[1])
    return out


@pytest.mark.parametrize("vdt", ["float32", "float16", "int8"])
def test_gaps_over_255_split_by_zero_entries_where_that_is_smaller(vdt: str) -> None:
    """At 1.5 % of a tensor a few gaps are over 255: an add delta splits them with zero-valued
    entries 255 apart and keeps one byte a gap; it decodes to the same change, in fewer bytes
    than the same entries with 2-byte gaps (a set delta, where a zero would not be a no-op)."""
    rng = np.random.default_rng(3)
    idx = np.sort(rng.choice(100_000, 1_500, replace=False))
    vals = rng.standard_normal(idx.size).astype(np.float32)
    vals = round_int8(vals) if vdt == "int8" else vals.astype(vdt).astype(np.float32)
    add, put = encode(delta({"big": (idx, vals)}), vdt), encode(delta({"big": (idx, vals)}, op="set"), vdt)
    a, p = raw(add)["data"][0], raw(put)["data"][0]
    assert (a["w"], p["w"]) == (1, 2) and a["n"] > idx.size == p["n"]
    assert len(add) < len(put) - idx.size // 2
    got = decode(add, SPEC).entries["big"]
    assert np.array_equal(dense(got, 100_000), dense((idx, vals), 100_000))
    assert set(idx) <= set(got[0]) and not got[1][~np.isin(got[0], idx)].any()  # what was added is zeros
    out = decode(put, SPEC).entries["big"]
    assert np.array_equal(out[0], idx) and np.array_equal(out[1], vals)


def test_zero_entries_only_where_they_pay() -> None:
    far = np.array([5, 60_000, 99_000])  # each split would take hundreds of entries
    entry = raw(encode(delta({"big": (far, np.ones(3, np.float32))}), "int8"))["data"][0]
    assert (entry["w"], entry["n"]) == (2, 3)
    near = np.array([0, 256, 300])  # int8: one entry more (2 bytes) saves 3 of 2-byte gaps
    out = decode(encode(delta({"big": (near, np.ones(3, np.float32))}), "int8"), SPEC).entries["big"]
    assert np.array_equal(out[0], [0, 255, 256, 300]) and np.array_equal(out[1], [1, 0, 1, 1])
    out = decode(encode(delta({"big": (near, np.ones(3, np.float32))})), SPEC).entries["big"]
    assert np.array_equal(out[0], near)  # float32: 5 bytes for the entry, 3 saved: not split


def test_lz4_used_only_when_smaller() -> None:
    regular = np.arange(0, 100_000, 3)  # constant gaps: compresses well
    d = delta({"big": (regular, np.ones(regular.size, np.float32))})
    entry = raw(encode(d))["data"][0]
    assert entry["z"] == 1 and len(entry["i"]) < regular.size // 4
    assert np.array_equal(decode(encode(d), SPEC).entries["big"][0], regular)
    few = np.array([3, 77, 150])  # tiny: lz4 would only add overhead
    entry = raw(encode(delta({"w": (few, np.ones(3, np.float32))})))["data"][0]
    assert entry["z"] == 0 and len(entry["i"]) == 3


def test_encoder_refuses_bad_indices_and_nan() -> None:
    for idx in ([3, 3], [5, 4], [-1], [1200]):
        with pytest.raises(ValueError):
            encode(delta({"w": (np.array(idx), np.ones(len(idx), np.float32))}))
    with pytest.raises(ValueError):
        encode(delta({"w": (np.array([1]), np.array([np.nan], np.float32))}))
    with pytest.raises(ValueError):
        encode(delta({"nope": (np.array([1]), np.ones(1, np.float32))}))


def test_model_spec_from_state_dict_skips_integer_buffers() -> None:
    from torch import nn

    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    spec = ModelSpec.from_state_dict(model.state_dict(), "x")
    assert spec.names == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                          "1.running_var"]
    assert spec.tensors[0] == TensorSpec("0.weight", (2, 1, 3, 3), "float32")
    assert spec.numel == 18 + 2 + 2 * 4


# ------------------------------------------------------------------------------- bad input


def test_oversize_checked_first() -> None:
    with pytest.raises(PayloadError, match="too large"):
        decode(b"\xff" * 101, SPEC, max_bytes=100)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"garbage!", b"\x93\x01\x02\x03", b"\x01",
                                  repack({"fmt": 1}), repack({"x": 1}), "text"])
def test_garbage_refused(data: bytes) -> None:
    with pytest.raises(PayloadError):
        decode(data, SPEC)  # type: ignore[arg-type]


def test_truncated_refused_at_every_length() -> None:
    data = encode(sample_delta())
    for cut in range(0, len(data), 37):
        with pytest.raises(PayloadError):
            decode(data[:cut], SPEC)


def test_unknown_fmt_kind_op_and_fields() -> None:
    base = raw(encode(sample_delta()))
    for key, value in [("fmt", 2), ("fmt", "1"), ("kind", "diff"), ("op", "mul"),
                       ("vdt", "float64"), ("ver", -1), ("base", 8), ("step", True),
                       ("loss", "low"), ("node", ""), ("epoch", 5), ("specs", {})]:
        with pytest.raises(PayloadError):
            decode(repack({**base, key: value}), SPEC)
    with pytest.raises(PayloadError):
        decode(repack({**base, "extra": 1}), SPEC)
    missing = dict(base)
    del missing["loss"]
    with pytest.raises(PayloadError):
        decode(repack(missing), SPEC)


def test_fingerprint_and_spec_mismatch() -> None:
    data = encode(snapshot())
    with pytest.raises(ArchitectureMismatch):
        decode(data, ModelSpec("other", SPEC.tensors))
    reshaped = ModelSpec("fp0", [TensorSpec("w", (30, 40))] + SPEC.tensors[1:])
    with pytest.raises(ArchitectureMismatch):
        decode(data, reshaped)
    renamed = ModelSpec("fp0", [TensorSpec("v", (40, 30))] + SPEC.tensors[1:])
    with pytest.raises(ArchitectureMismatch):
        decode(data, renamed)
    assert isinstance(decode(data, None), Snapshot)  # without expect: self-described


def test_byte_lengths_must_match() -> None:
    obj = raw(encode(snapshot()))
    obj["data"][1] = obj["data"][1][:-4]
    with pytest.raises(PayloadError, match="count"):
        decode(repack(obj), SPEC)
    obj = raw(encode(sample_delta()))
    obj["data"][0]["v"] += b"\0\0\0\0"
    with pytest.raises(PayloadError):
        decode(repack(obj), SPEC)
    obj = raw(encode(sample_delta()))
    obj["data"][0]["n"] += 1
    with pytest.raises(PayloadError):
        decode(repack(obj), SPEC)


def _delta_with_gaps(gaps: list[int], width: int = 2) -> bytes:
    obj = raw(encode(delta({"w": (np.array([1]), np.ones(1, np.float32))})))
    obj["data"][0].update(n=len(gaps), w=width, z=0, v=np.ones(len(gaps), "<f4").tobytes(),
                          i=np.array(gaps, {1: "<u1", 2: "<u2", 4: "<u4"}.get(width, "<u1")).tobytes())
    return repack(obj)


def test_indices_out_of_range_or_not_increasing() -> None:
    assert np.array_equal(decode(_delta_with_gaps([5, 1, 1]), SPEC).entries["w"][0], [5, 6, 7])
    for gaps in ([1200], [1000, 200], [5, 0], [0, 0]):
        with pytest.raises(PayloadError):
            decode(_delta_with_gaps(gaps), SPEC)
    with pytest.raises(PayloadError):  # uint32 gaps summing past numel
        decode(_delta_with_gaps([2**32 - 1] * 3, width=4), SPEC)
    with pytest.raises(PayloadError):
        decode(_delta_with_gaps([1], width=3), SPEC)


def test_entries_must_be_ordered_and_known() -> None:
    obj = raw(encode(sample_delta()))
    obj["data"].reverse()
    with pytest.raises(PayloadError):
        decode(repack(obj), SPEC)
    obj = raw(encode(sample_delta()))
    obj["data"][1]["t"] = 99
    with pytest.raises(PayloadError):
        decode(repack(obj), SPEC)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values(bad: float) -> None:
    obj = raw(encode(snapshot()))
    a = np.frombuffer(obj["data"][0], "<f4").copy()
    a[17] = bad
    obj["data"][0] = a.tobytes()
    with pytest.raises(NonFiniteError):
        decode(repack(obj), SPEC)
    obj = raw(encode(sample_delta()))
    v = np.frombuffer(obj["data"][0]["v"], "<f4").copy()
    v[-1] = bad
    obj["data"][0]["v"] = v.tobytes()
    with pytest.raises(NonFiniteError):
        decode(repack(obj), SPEC)
    obj = raw(encode(sample_delta()))
    obj["loss"] = bad
    if np.isnan(bad):  # NaN loss means "no loss yet" and is accepted
        assert np.isnan(decode(repack(obj), SPEC).header.loss)
    else:
        with pytest.raises(NonFiniteError):
            decode(repack(obj), SPEC)


def test_float16_inf_on_wire_refused() -> None:
    obj = raw(encode(sample_delta(), "float16"))
    obj["data"][0]["v"] = np.full(50, np.inf, "<f2").tobytes()
    with pytest.raises(NonFiniteError):
        decode(repack(obj), SPEC)


def test_lz4_bomb_and_corrupt_lz4() -> None:
    bomb = lz4.block.compress(b"\x01" * 50_000_000, store_size=False)
    assert len(bomb) < 300_000
    obj = raw(encode(delta({"big": (np.array([1, 2]), np.ones(2, np.float32))})))
    obj["data"][0].update(z=1, i=bomb)
    with pytest.raises(PayloadError, match="lz4"):
        decode(repack(obj), SPEC)
    obj["data"][0]["i"] = b"\xff\x00garbage"
    with pytest.raises(PayloadError):
        decode(repack(obj), SPEC)


def test_msgpack_limits_and_types() -> None:
    with pytest.raises(PayloadError):  # ext types are refused
        decode(msgpack.packb({"fmt": msgpack.ExtType(1, b"x")}), SPEC)
    with pytest.raises(PayloadError):  # non-str map keys
        decode(msgpack.packb({1: 2}), SPEC)
    with pytest.raises(PayloadError):  # deep nesting
        decode(b"\x91" * 5000 + b"\x00", SPEC)
    obj = raw(encode(snapshot()))
    obj["specs"][0][1] = [2**40, 2**40]
    with pytest.raises(PayloadError):
        decode(repack(obj), None)
