"""Values rounded to what a delta's entries carry on the wire (float16, or int8 as k * 2**e
with one power-of-two exponent an entry). Whoever keeps a public copy x̂ adds the *rounded*
values, so that the sender and every receiver stay bit-equal; the codec refuses int8 values
that were not rounded here first.
"""

from __future__ import annotations

import math

import numpy as np

#: int8 values are k * 2**e per tensor entry (|k| <= 127, e in this range): a power-of-two
#: scale, so k * 2**e is exact in float32 and the encoder recovers k and e from the values alone
INT8_LEVELS = 127
INT8_EXPONENTS = (-126, 120)


def int8_exponent(maxabs: float) -> int:
    """The least e with maxabs / 2**e <= 127: the scale of an int8 entry whose largest value
    is ``maxabs``. Rounding keeps the largest |k| in [64, 127], so the values rounded with it
    give this same e again (what the encoder relies on)."""
    e = math.frexp(maxabs / INT8_LEVELS)[1]  # maxabs/127 = m * 2**e, 0.5 <= m < 1: 2**(e-1) <= it < 2**e
    while e > INT8_EXPONENTS[0] and math.ldexp(maxabs, -(e - 1)) <= INT8_LEVELS:
        e -= 1
    while math.ldexp(maxabs, -e) > INT8_LEVELS:
        e += 1
    return e


def round_int8(values: np.ndarray) -> np.ndarray:
    """Values rounded to what an int8 entry carries (k * 2**e, float32): who keeps x_hat adds
    these, so that sender and receivers stay bit-equal. An entry too small for the exponent
    range rounds to zeros."""
    a = np.asarray(values, dtype=np.float32)
    maxabs = float(np.abs(a).max()) if a.size else 0.0
    if maxabs == 0.0 or not math.isfinite(maxabs):
        return np.zeros_like(a) if maxabs == 0.0 else a
    e = int8_exponent(maxabs)
    if e < INT8_EXPONENTS[0] or e > INT8_EXPONENTS[1]:
        return np.zeros_like(a)
    return np.ldexp(np.rint(np.ldexp(a, -e)), e).astype(np.float32)


def rounded(values: np.ndarray, value_dtype: str) -> np.ndarray:
    """Values rounded to what ``value_dtype`` carries (float16, or int8's k * 2**e), as float32;
    float32: unchanged. Whoever keeps an x_hat adds exactly these values."""
    if value_dtype == "float32":
        return values
    v = np.asarray(values, np.float32)
    return round_int8(v) if value_dtype == "int8" else v.astype(np.float16).astype(np.float32)


def round_for_wire(idx: np.ndarray, values: np.ndarray, value_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """A delta entry's values :func:`rounded`, and the entries that rounded to zero dropped
    (nothing to send, nothing to add). float32: unchanged."""
    if value_dtype == "float32":
        return idx, values
    v = rounded(values, value_dtype)
    keep = v != 0
    return idx[keep], v[keep]
