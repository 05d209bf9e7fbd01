"""The synchronous mode's values on the wire (p2pnode/sync/values.py): int8 and int4 in blocks
keep every value within half a step of its block's scale, and malformed bytes are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from p2pnode.sync.values import BLOCK, LEVELS, BadValues, decode, encode

finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@settings(max_examples=100, deadline=None)
@given(x=arrays(np.float32, st.integers(1, 300), elements=finite))
def test_blocks_keep_each_value_within_half_a_step_of_its_blocks_scale(kind: str, x: np.ndarray) -> None:
    data = encode(x, kind)
    body = x.size if kind == "int8" else (x.size + 1) // 2  # int4: two values a byte
    assert len(data) == 4 + 4 * math.ceil(x.size / BLOCK) + body
    y = decode(data, kind, x.size)
    for b in range(0, x.size, BLOCK):
        block = x[b:b + BLOCK].astype(np.float64)
        step = np.abs(block).max() / LEVELS[kind]
        assert np.all(np.abs(y[b:b + BLOCK] - block) <= step / 2 * (1 + 1e-6) + 1e-30)


def test_int4_carries_every_level_of_a_block_both_signs_and_an_odd_count() -> None:
    x = np.arange(-7, 8, dtype=np.float32) * 0.5  # 15 values: the last byte's high half unused
    data = encode(x, "int4")
    assert len(data) == 4 + 4 + 8
    assert decode(data, "int4").tolist() == x.tolist()


def test_a_block_of_small_values_beside_large_ones_keeps_its_digits() -> None:
    """Why blocks: a factor's columns differ by orders of magnitude. One scale for the whole
    tensor would round the small column to zero; a block's own scale keeps two digits of it."""
    big = np.full(BLOCK, 100.0, dtype=np.float32)
    small = np.linspace(1e-4, 2e-4, BLOCK, dtype=np.float32)
    y = decode(encode(np.concatenate([big, small]), "int8"), "int8")
    assert np.allclose(y[:BLOCK], 100.0)
    assert np.max(np.abs(y[BLOCK:] - small) / small) < 0.01
    assert np.all(decode(encode(np.zeros(10), "int8"), "int8") == 0)  # a zero block: scale 0, no NaN


def test_float16_clips_rather_than_sending_infinities() -> None:
    y = decode(encode(np.array([1e6, -1e6, 1.5]), "float16"), "float16")
    assert y.tolist() == [65504.0, -65504.0, 1.5]


def bad_blocks() -> list[tuple[str, bytes, str]]:
    out = []
    for kind in LEVELS:
        good = encode(np.arange(100, dtype=np.float32), kind)
        nan_scale = good[:4] + np.float32(np.nan).tobytes() + good[8:]
        neg_scale = good[:4] + np.float32(-1.0).tobytes() + good[8:]
        out += [(kind, data, why) for data, why in [
            (b"", "count"), (good[:3], "count"), (good[:-1], "bytes for a count"), (good + b"\0", "bytes for a count"),
            (np.uint32(0).tobytes(), "count of 0"), (np.uint32(2**31).tobytes() + good[4:], "bytes for a count"),
            (nan_scale, "scale"), (neg_scale, "scale")]]
    # int4: a half byte of 0 would be -8, a level no encoder writes
    out.append(("int4", encode(np.ones(2), "int4")[:-1] + b"\x00", "out of range"))
    return out


@pytest.mark.parametrize("kind,data,why", bad_blocks())
def test_malformed_blocks_are_refused(kind: str, data: bytes, why: str) -> None:
    with pytest.raises(BadValues, match=why):
        decode(data, kind)


def test_a_length_other_than_expected_and_non_finite_float16_are_refused() -> None:
    with pytest.raises(BadValues, match="where 5 were expected"):
        decode(encode(np.ones(4), "int8"), "int8", 5)
    with pytest.raises(BadValues, match="non-finite"):
        decode(np.array([np.inf], dtype="<f2").tobytes(), "float16")
    with pytest.raises(BadValues, match="multiple of 2"):
        decode(b"\0\0\0", "float16")
    # a node configured for float16 among int8 ones: its bytes do not read as int8; nor int8's as int4
    with pytest.raises(BadValues, match="bytes for a count"):
        decode(encode(np.linspace(-1, 1, 1000), "float16"), "int8")
    with pytest.raises(BadValues, match="bytes for a count"):
        decode(encode(np.linspace(-1, 1, 1000), "int8"), "int4")
